"""What a run's page in the MLflow UI shows: its description (what ran; what its task says of itself: what one call
is, its own figures, a training step's optimizer and loss; how fast, how accurate, on what) and its metrics in units
the UI's charts print legibly (ui_metric), with the way back to result.json's names and units (stored_metric)."""

from __future__ import annotations

import math
import re

from runner.record.naming import run_name
from runner.record.result import Result
from runner.tasks import Task, task_class


def note_content(result: Result) -> str:
    """The run's description in the UI: what ran, how fast (median ± IQR), how accurate, on what."""
    from runner.record.table import format_seconds

    m, c = result.metrics, result.config
    lines = [f"**{run_name(c)}**, batch {c.get('batch_size')}, seed {c.get('seed')}: {result.status}"]
    task = task_class((c.get("task") or {}).get("_target_"), (c.get("task") or {}).get("name"))
    lines += task.page_lines(c, m, result.environment, format_seconds)  # what a call is, the task's own figures
    if "time_median_s" in m:
        unit = "per call" if task.unit == Task.unit else task.unit  # 'a generation', 'a step'
        typical = f"typical {format_seconds(m['time_typical_s'])} {unit} (what ratios and rates use); " if (
            "time_typical_s" in m
        ) else ""  # fmt: skip
        lines.append(
            f"{typical}median {format_seconds(m['time_median_s'])} ± {format_seconds(m['time_iqr_s'])} (IQR) "
            f"over {m.get('n_samples', '?')} samples; first call {format_seconds(m['first_call_s'])}"
        )
    if "throughput_per_s" in m:
        lines.append(f"{m['throughput_per_s']:.3g} examples/s")
    if "max_rel_err_vs_reference" in m:
        within = {1.0: "within", 0.0: "beyond"}.get(m.get("within_reference_tolerance", -1.0))
        tolerance = f" ({within} its tolerance {m['reference_tolerance']:.2g})" if within else ""
        lines.append(f"max rel err vs the float64 reference {m['max_rel_err_vs_reference']:.2g}{tolerance}")
    lines += [f"warning: {w}" for w in result.warnings]
    if result.error:
        lines.append(f"error: {result.error}")
    env = result.environment
    if env:
        framework = f"{env.get('framework', '')} {env.get('framework_version', '')}".strip()
        device = env.get("cpu") if env.get("device") == "cpu" else env.get("device_name")  # not "x86_64"
        lines.append(f"on {device or '?'} ({framework})")
    return "  \n".join(lines)[:5000]


SECONDS = re.compile(r"(?<=_)s(?=_|$)")  # the unit in time_median_s, cpu_s_per_call; not in throughput_per_s
MICROSECONDS = re.compile(r"(?<=_)us(?=_|$)")
JOULES = re.compile(r"(?<=_)j$")  # energy_per_call_j; not examples_per_j
MICROJOULES = re.compile(r"(?<=_)uj$")
ERRORS = re.compile(r"(^|_)err(_|$)|^reference_tolerance$")  # max_rel_err_vs_reference, its tolerance
LOG10 = "_log10"
LEFT_OUT = ("time_p50_s",)  # the median again: result.json keeps it, the UI would show it twice
ZERO_SAYS_NOTHING = ("machine_steal_pct",)  # no CPU steal (any machine not a VM): a bar reading 0.00
DIGITS = 4  # significant digits MLflow shows of a metric (result.json keeps every digit): 18.57, not 18.570109987194883
SHOWN = 0.005  # the UI's charts print a metric with two decimals (toFixed(2)): below this it reads "0.00"
TRACE = "trace/time_sample_us"  # every sample, step = its index; the section `trace` is the UI's first chart


def ui_metric(name: str, value: float) -> tuple[str, float] | None:
    """A metric as MLflow shows it, or None where it is not logged. The UI's charts print two decimals, so a
    metric goes in a unit that shows it: seconds as microseconds, named so (time_median_s 1.8e-05 -> time_median_us
    18.57), legible from a sigmoid's 50 ns (0.05) to a ResNet's first call; joules as microjoules (_uj); errors
    and their tolerance, which span 1e-16 to 1 and would all read 0.00, as their base-10 logarithm (_log10:
    max_rel_err_vs_reference 2.03e-07 -> max_rel_err_vs_reference_log10 -6.69 beside reference_tolerance_log10
    -5; an exact result, log10 0, is left out, as is a CPU steal that reads 0.00). result.json and the report
    CSVs keep seconds and the errors themselves."""
    if name in LEFT_OUT or (name in ZERO_SAYS_NOTHING and abs(value) < SHOWN):
        return None
    if "per_s" not in name and SECONDS.search(name):
        name, value = SECONDS.sub("us", name, count=1), value * 1e6
    elif "per_j" not in name and JOULES.search(name):
        name, value = JOULES.sub("uj", name), value * 1e6
    elif ERRORS.search(name):
        if not value > 0:  # exact (or not a number): no logarithm
            return None
        name, value = name + LOG10, math.log10(value)
    return name, float(f"{value:.{DIGITS}g}")


def stored_metric(name: str, value: float) -> tuple[str, float]:
    """ui_metric undone: a metric read back from MLflow under its result.json name, in seconds, joules and
    plain errors (to the 4 digits MLflow holds)."""
    if MICROSECONDS.search(name):
        return MICROSECONDS.sub("s", name, count=1), value / 1e6
    if MICROJOULES.search(name):
        return MICROJOULES.sub("j", name), value / 1e6
    if name.endswith(LOG10) and ERRORS.search(name.removesuffix(LOG10)):
        return name.removesuffix(LOG10), 10.0**value
    return name, value


def microseconds(seconds: float) -> float:
    """A timing sample in microseconds to DIGITS figures, as the other metrics (the runs list shows the last)."""
    return float(f"{float(seconds) * 1e6:.{DIGITS}g}")

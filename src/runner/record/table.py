"""The one table: the columns a person reads about a run, in human units, declared once.

The terminal (one run or a sweep), a sweep's summary.md, `runner report`'s runs.md / runs.csv and
experiments/summarize.py all show these columns; runs.csv keeps the raw numbers under `key`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from runner.tasks import builtin_metrics


def format_seconds(seconds: float) -> str:
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("µs", 1e-6)):
        if seconds >= scale:
            return f"{seconds / scale:.3g} {unit}"
    return f"{seconds / 1e-9:.3g} ns"


def _number(value: float) -> str:
    return f"{value:.3g}"


def format_ratio(value: float) -> str:
    """A time ratio to three significant figures at most, as every table, plot and MLflow page prints it: '1.31x',
    '22.7x', '253x'."""
    return f"{ratio_figure(value):g}x" if value >= 9.995 else f"{value:.2f}x"


def ratio_figure(value: float) -> float:
    """The ratio as printed (format_ratio), as a number: what MLflow records, so a page and a table agree."""
    digits = 2 if value < 9.995 else 1 if value < 99.95 else 0
    return round(float(value), digits)


def _count(value: float) -> str:
    return f"{int(value)}"


def format_interval(bounds: tuple[float, float]) -> str:
    """An interval as every table prints it: '21.5–23.9x' (format_ratio's figures), '' where there is none."""
    low, high = bounds
    if low is None or high is None or math.isnan(low) or math.isnan(high):
        return ""
    return f"{format_ratio(low)[:-1]}–{format_ratio(high)}"  # an en dash, as the sweep's answer writes intervals


def _one_decimal(value: float) -> str:
    return f"{value:.1f}"


def format_resolution(value: float) -> str:
    """The smallest difference a comparison calls (0.225: '22.5%'); from 100% on as the factor it is ('a 9.99x
    difference'), as no share above 100% reads as a resolution; '' where there is none."""
    if not math.isfinite(value):
        return ""
    return f"{value:.1%}" if value < 1 else f"a {1 + value:.3g}x difference"


def _percent(value: float) -> str:
    return f"{value:.0f}%"


def _megabytes(value: float) -> str:
    return f"{value:.1f} MB"


def _yes_no(value: float) -> str:
    return "yes" if value else "no"


@dataclass(frozen=True)
class Column:
    key: str  # a metric of result.json, or a comparison (report.COMPARISON)
    label: str  # the heading a person reads
    format: Callable[[Any], str] = str

    def cell(self, record: Mapping[str, Any]) -> str:
        """The formatted value in `record`, or "" where it has none."""
        value = record.get(self.key)
        if value is None or (isinstance(value, float) and math.isnan(value)):
            return ""
        return self.format(value)


COLUMNS: tuple[Column, ...] = (
    Column("time_median_s", "median", format_seconds),
    Column("time_iqr_s", "IQR", format_seconds),
    Column("time_typical_s", "typical", format_seconds),  # what time / fastest compares: runner.report.comparison
    Column("time_min_s", "min", format_seconds),
    Column("time_p90_s", "p90", format_seconds),
    Column("time_p95_s", "p95", format_seconds),
    Column("time_p99_s", "p99", format_seconds),
    Column("time_mean_s", "mean", format_seconds),
    Column("time_stdev_s", "stdev", format_seconds),
    Column("first_call_s", "first call", format_seconds),  # tracing, compilation
    Column("load_s", "load", format_seconds),  # device start-up, weights built and placed
    Column("throughput_per_s", "examples/s", _number),
    *(Column(m.key, m.heading, format_seconds if m.kind == "seconds" else _number) for m in builtin_metrics()),
    Column("gflops_per_s", "GFLOP/s", _number),
    Column("time_ratio", "time / fastest job", format_ratio),
    Column("time_ratio_ci", "95% interval", format_interval),  # over the rounds: runner.report.comparison
    Column("time_ratio_resolution", "resolves", format_resolution),  # the smallest difference called 9 times in 10
    Column("within_noise", "verdict"),  # the verdict with its reason: runner.report.comparison
    Column("time_ratio_basis", "ratio from"),  # "40 rounds", "1 round"
    Column("max_abs_err_vs_reference", "max abs err", _number),
    Column("max_rel_err_vs_reference", "max rel err", _number),
    Column("shares_memory", "shares memory", _yes_no),
    Column("copied", "copied", _yes_no),
    Column("result_is_float64", "float64 result", _yes_no),
    Column("n_samples", "samples", _count),
    Column("calls_per_sample", "calls/sample", _count),
    Column("n_rounds", "rounds", _count),
    Column("n_processes", "processes", _count),
    Column("machine_other_runnable", "other runnable", _one_decimal),  # threads of other processes, on average
    Column("machine_load_1m", "load 1m", _one_decimal),
    Column("machine_steal_pct", "CPU steal", _percent),
    Column("peak_host_mb", "peak host", _megabytes),
    Column("peak_device_mb", "peak device", _megabytes),
    Column("energy_per_call_j", "J/call", _number),
    Column("examples_per_j", "examples/J", _number),
)
_TERMINAL_ONLY = (
    *("time_min_s", "max_abs_err_vs_reference", "n_samples", "calls_per_sample", "peak_host_mb"),
    # the tail: one more column would fold a sweep row's headings; runs.csv and runs.md have every column
    *("time_p90_s", "time_p95_s", "time_p99_s", "time_mean_s", "time_stdev_s", "load_s"),
    *("energy_per_call_j", "examples_per_j"),
    *("n_rounds", "n_processes"),
    *(m.key for m in builtin_metrics() if not m.in_terminal),
    *("machine_other_runnable", "machine_load_1m", "machine_steal_pct"),  # a busy machine warns
)
PROSE = ("time_ratio_ci", "within_noise")  # cells made of other values: runs.csv has those values instead
SWEEP_COLUMNS = tuple(c for c in COLUMNS if c.key not in _TERMINAL_ONLY)  # a row per job must fit a terminal


def present(columns: tuple[Column, ...], records: Sequence[Mapping[str, Any]]) -> list[Column]:
    """The columns that have a value in at least one record."""
    return [c for c in columns if any(c.cell(r) for r in records)]


def rows(columns: list[Column], records: Sequence[Mapping[str, Any]]) -> list[list[str]]:
    return [[c.cell(r) for c in columns] for r in records]


def markdown(headers: list[str], cells: list[list[str]]) -> str:
    def escape(text: str) -> str:
        return text.replace("|", "\\|").replace("\n", " ")

    lines = ["| " + " | ".join(map(escape, headers)) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(map(escape, row)) + " |" for row in cells]
    return "\n".join(lines) + "\n"

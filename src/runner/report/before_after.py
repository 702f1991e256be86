"""`runner compare BEFORE AFTER`: did the same work get faster or slower between two measurements made apart
(another framework version, another commit of the code measured, another machine)?

Each side is a run directory, a sweep directory, or an MLflow run id (a sweep's parent run: its jobs).
Runs are matched by what they ran: their params, timing and tracking settings aside. The ratio is
after / before, with the 95% interval of runner.report.ratio taken unpaired (the two ran apart, so round r
of one met a different moment of the machine than round r of the other) and widened by the drift of the
machine between two sweeps (ratio.APART_SD), shared among the pairs compared at once. As asv's `compare`
does for commits, a change is called only when the interval excludes 1 and the ratio is beyond `factor`:
a difference that is real but small is not worth a verdict.
"""

from __future__ import annotations

import math
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd

from runner import report, tracking
from runner.measure.machine_load import BUSY_OTHER_RUNNABLE
from runner.measure.samples import turn_typical
from runner.record import setups
from runner.record.result import RESULT_FILE, TENSORS_FILE, Status
from runner.report.ratio import APART_SD, PROCESS_SD, instability, process_count, tamed, time_ratio

FACTOR = 1.1  # asv compare's default


def load(source: str, uri: str | None, downloads: Path) -> pd.DataFrame:
    """The runs one side names: a run or sweep directory, or an MLflow run id at `uri`. Samples of MLflow
    runs whose directory is not on this machine come from their tensors.h5 artifact, fetched into `downloads`."""
    path = Path(source)
    if path.is_dir():
        dirs = [path] if (path / RESULT_FILE).exists() else report.sweep_run_dirs(path)
        if not dirs:
            raise LookupError(f"{path} holds no run ({RESULT_FILE}) and no sweep of runs")
        return report.runs_from_dirs(dirs)
    if not uri:
        raise LookupError(f"{source} is neither a directory nor, without --tracking-uri or MLFLOW_TRACKING_URI, a run")
    rows = tracking.runs_of(uri, source)
    for row in rows:
        if not (row["run_dir"] and (Path(row["run_dir"]) / TENSORS_FILE).exists()):
            row["run_dir"] = tracking.download_tensors(uri, row["run_id"], downloads / row["run_id"])
    return report.runs_from_mlflow_rows(rows)


def match(before: pd.DataFrame, after: pd.DataFrame) -> list[tuple[pd.Series, pd.Series]]:
    """Pairs of finished, timed runs that did the same work (the params both sides record, timing and
    tracking aside), in the order of `before`."""
    before, after = _timed(before), _timed(after)
    shared = set(before) & set(after)
    keys = sorted(k for k in shared if k.startswith("params.") and not k.startswith(report.NOT_LABELS))

    def identity(frame: pd.DataFrame) -> pd.Series:
        return frame[keys].map(_param_text).agg("|".join, axis=1)

    found = {key: index for index, key in identity(after).items()}
    return [(before.loc[i], after.loc[found[key]]) for i, key in identity(before).items() if key in found]


def _param_text(value: object) -> str:
    return "" if value is None or (isinstance(value, float) and math.isnan(value)) else str(value)


def _timed(frame: pd.DataFrame) -> pd.DataFrame:
    if frame.empty or "metrics.time_median_s" not in frame:
        return frame.iloc[0:0]
    return frame[(frame["status"] == Status.FINISHED) & frame["metrics.time_median_s"].notna()]


def verdict(ratio, factor: float) -> str:
    """'slower', 'faster', 'no change (within noise)', 'no change (under 1.10x)' or 'cannot tell (...)'."""
    if math.isnan(ratio.low):
        return f"cannot tell ({ratio.basis()})"
    if ratio.low <= 1.0 <= ratio.high:
        return "no change (within noise)"
    if max(ratio.value, 1 / ratio.value) < factor:
        return f"no change (under {factor:.2f}x)"
    return "slower" if ratio.value > 1 else "faster"


def compare(before: pd.DataFrame, after: pd.DataFrame, factor: float = FACTOR) -> pd.DataFrame:
    """One row per matched pair: its label, both medians, after / before with its interval, the verdict."""
    pairs = match(before, after)
    rows = []
    for old, new in pairs:
        ratio = _apart_ratio(new, old, len(pairs))
        unstable = next((why for why in map(_instability, (old, new)) if why), None)
        rows.append(
            {
                "run": old["run"].split(" #")[0],
                "before": typical_time(old),
                "after": typical_time(new),
                "ratio": ratio.value if ratio else typical_time(new) / typical_time(old),
                "low": ratio.low if ratio else math.nan,
                "high": ratio.high if ratio else math.nan,
                "verdict": unstable
                or _unless_busy(verdict(ratio, factor) if ratio else "cannot tell (no samples)", old, new),
            }
        )
    return pd.DataFrame(rows, columns=["run", "before", "after", "ratio", "low", "high", "verdict"])


def _apart_ratio(new: pd.Series, old: pd.Series, comparisons: int):
    """new / old, unpaired, with the spread of the machine's state between two runs apart (ratio.APART_SD)."""
    if old["samples_s"] is None or new["samples_s"] is None:
        return None
    processes = (
        process_count((new["samples_s"], None, new.get("sample_processes"))),
        process_count((old["samples_s"], None, old.get("sample_processes"))),
    )
    # the interval adds process_sd^2 (1/p_new + 1/p_old): PROCESS_SD's share for each side's processes, APART_SD^2 once
    process_sd = math.sqrt(PROCESS_SD**2 + APART_SD**2 / (1 / processes[0] + 1 / processes[1]))
    samples = (new["samples_s"], new["sample_rounds"], old["samples_s"], old["sample_rounds"])
    return time_ratio(*samples, comparisons, process_sd=process_sd, paired=False, processes=processes)


def typical_time(run: pd.Series) -> float:
    """The geometric mean of the run's per-round typical times (each turn's fastest sample, outlying rounds pulled
    in: ratio.tamed): what the unpaired ratio compares (its median where its samples are not to be had), so that
    after / before is the ratio of the two columns beside it."""
    if run["samples_s"] is None:
        return float(run["metrics.time_median_s"])
    per_round = turn_typical(run["samples_s"], run["sample_rounds"])
    return math.exp(np.mean(tamed(np.log([per_round[r] for r in sorted(per_round)]))))


def _instability(run: pd.Series) -> str | None:
    why = instability(run["samples_s"], run["sample_rounds"]) if run["samples_s"] is not None else None
    return f"cannot tell (unstable: {why})" if why else None


def _unless_busy(called: str, old: pd.Series, new: pd.Series) -> str:
    """No change called where either side ran on a busy machine: runs measured apart then differ by what else
    ran (the same single-threaded matmul took 2x as long beside a process burning a core, BENCHMARKS.md), which
    no interval over their rounds can see."""
    others = max(run.get("metrics.machine_other_runnable") or 0.0 for run in (old, new))
    if called not in ("slower", "faster") or others <= BUSY_OTHER_RUNNABLE:
        return called
    return f"cannot tell (looks {called}, but the machine was busy: {others:.1f} other runnable threads on average)"


def run(before_source: str, after_source: str, uri: str | None, factor: float = FACTOR) -> list[str]:
    """The lines `runner compare` prints: what differs between the sides, the table, what did not match."""
    from runner.record.table import format_seconds
    from runner.record.table import markdown as table_markdown

    with tempfile.TemporaryDirectory(prefix="runner-compare-") as downloads:
        before, after = load(before_source, uri, Path(downloads)), load(after_source, uri, Path(downloads))
        compared = compare(before, after, factor)
    if compared.empty:
        raise LookupError(f"no run of {after_source} did the same work as a finished run of {before_source}")
    lines = [
        f"before: {before_source} ({len(before)} runs); after: {after_source} ({len(after)} runs)",
        f"what differs: {setups.differences(before, after)}",
        "",
    ]
    headers = ["run", "before", "after", "after / before", "95% interval", "verdict"]
    cells = [
        [r.run, format_seconds(r.before), format_seconds(r.after), f"{r.ratio:.2f}x", _interval(r.low, r.high)]
        + [r.verdict]
        for r in compared.itertuples()
    ]
    lines.append(table_markdown(headers, cells))
    lines.append("before, after: each run's typical time, the geometric mean over its rounds of each turn's fastest")
    lines.append(
        f"block (what the ratio compares); a change is called where the interval excludes 1 and the ratio is beyond "
        f"{factor:.2f}x"
    )
    unmatched = len(_timed(before)) - len(compared)
    if unmatched:
        lines.append(f"{unmatched} finished run(s) of {before_source} did work no run of {after_source} did")
    return lines


def _interval(low: float, high: float) -> str:
    return "" if math.isnan(low) else f"{low:.2f}-{high:.2f}x"

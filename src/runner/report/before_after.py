"""`runner compare BEFORE AFTER`: did the same work get faster or slower between two measurements made apart
(another framework version, another commit of the code measured, another machine)?

Each side is a run directory, a sweep directory, or an MLflow run id (a sweep's parent run: its jobs).
Runs are matched by what they ran: their params, timing and tracking settings aside. The ratio is
after / before, as runner.report.comparison compares runs measured apart: unpaired (round r of one met a different
moment of the machine than round r of the other), widened by the drift of the machine between two sweeps, the 95%
shared among the pairs compared at once. As asv's `compare` does for commits, a change is called only when the
interval excludes 1 and the ratio is beyond `factor`: a difference that is real but small is not worth a verdict.
"""

from __future__ import annotations

import math
import tempfile
from pathlib import Path

import pandas as pd

from runner import report, tracking
from runner.record import setups
from runner.record.result import RESULT_FILE, TENSORS_FILE, Status
from runner.record.table import format_interval, format_ratio
from runner.report import comparison
from runner.report.frames import timings

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


def compare(before: pd.DataFrame, after: pd.DataFrame, factor: float = FACTOR) -> pd.DataFrame:
    """One row per matched pair: its label, both typical times, after / before with its interval, the verdict
    (runner.report.comparison, measured apart: unpaired, the drift between sweeps added)."""
    pairs = match(before, after)
    rows = []
    for old, new in pairs:
        was, now = timings(old.to_frame().T), timings(new.to_frame().T)
        found = comparison.compare(now, was, len(pairs), apart=True, factor=factor)
        cells = (found.ratio, found.low, found.high, found.words())
        rows.append((old["run"].split(" #")[0], was.typical_s(), now.typical_s(), *cells))
    return pd.DataFrame(rows, columns=["run", "before", "after", "ratio", "low", "high", "verdict"])


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
        [
            r.run,
            format_seconds(r.before),
            format_seconds(r.after),
            format_ratio(r.ratio),
            format_interval((r.low, r.high)),
        ]
        + [r.verdict]
        for r in compared.itertuples()
    ]
    lines.append(table_markdown(headers, cells))
    lines.append("before, after: each run's typical time, the median over its rounds of each turn's fastest block")
    lines.append(
        f"(what the ratio compares); a change is called where the interval excludes 1 and the ratio is beyond "
        f"{factor:.2f}x"
    )
    unmatched = len(_timed(before)) - len(compared)
    if unmatched:
        lines.append(f"{unmatched} finished run(s) of {before_source} did work no run of {after_source} did")
    return lines

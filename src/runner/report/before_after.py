"""`runner compare BEFORE AFTER`: did the same work get faster or slower between two measurements made apart
(another framework version, another commit of the code measured, another machine)?

Each side is a run directory, a sweep directory, or an MLflow run id (a sweep's parent run: its jobs).
Runs are matched by their case (runner.identity: every setting but the seed and how it was timed), a side's runs of
one case pooled as replicates. The ratio is
after / before, as runner.report.comparison compares runs measured apart: unpaired (round r of one met a different
moment of the machine than round r of the other), widened by the drift of the machine between two sweeps, the 95%
shared among the pairs compared at once. As asv's `compare` does for commits, a change is called only when the
interval excludes 1 and the ratio is beyond `factor`: a difference that is real but small is not worth a verdict.
"""

from __future__ import annotations

import tempfile
from dataclasses import replace
from pathlib import Path

import pandas as pd

from runner import report, tracking
from runner.record import runs, setups
from runner.record.result import RESULT_FILE, TENSORS_FILE
from runner.record.table import format_interval, format_ratio
from runner.report import comparison
from runner.report.frames import timed_runs, timings

FACTOR = 1.1  # asv compare's default


def load(source: str, uri: str | None, downloads: Path) -> pd.DataFrame:
    """The runs one side names: a run or sweep directory, or an MLflow run id at `uri`. Samples of MLflow
    runs whose directory is not on this machine come from their tensors.h5 artifact, fetched into `downloads`."""
    path = Path(source)
    if path.is_dir():
        found = runs.from_path(path)
        if not found:
            raise LookupError(f"{path} holds no run ({RESULT_FILE}) and no sweep of runs")
        return report.frame(found)
    if not uri:
        raise LookupError(f"{source} is neither a directory nor, without --tracking-uri or MLFLOW_TRACKING_URI, a run")
    found = [_with_samples(run, uri, downloads) for run in tracking.runs_of(uri, source)]
    return report.frame(found)


def _with_samples(run: runs.Run, uri: str, downloads: Path) -> runs.Run:
    """The run, its samples fetched from MLflow where its tensors.h5 is not on this machine."""
    if not run.run_id or (run.run_dir and (Path(run.run_dir) / TENSORS_FILE).exists()):
        return run
    return replace(run, run_dir=tracking.download_tensors(uri, run.run_id, downloads / run.run_id))


def match(before: pd.DataFrame, after: pd.DataFrame) -> list[tuple[pd.DataFrame, pd.DataFrame]]:
    """Pairs of cases (runner.identity: every setting but the seed and how it was timed) that both sides ran,
    finished and timed, in the order of `before`: each side's runs of it (replicates), pooled when compared."""
    before, after = timed_runs(before), timed_runs(after)
    theirs = dict(list(after.groupby("case", sort=False)))
    return [(mine, theirs[key]) for key, mine in before.groupby("case", sort=False) if key in theirs]


def compare(before: pd.DataFrame, after: pd.DataFrame, factor: float = FACTOR) -> pd.DataFrame:
    """One row per matched pair: its label, both typical times, after / before with its interval, the verdict
    (runner.report.comparison, measured apart: unpaired, the drift between sweeps added)."""
    pairs = match(before, after)
    rows = []
    for old, new in pairs:
        was, now = timings(old), timings(new)
        found = comparison.compare(now, was, len(pairs), apart=True, factor=factor)
        cells = (found.ratio, found.low, found.high, found.words())
        rows.append((_case_name(old), was.typical_s(), now.typical_s(), *cells))
    return pd.DataFrame(rows, columns=["run", "before", "after", "ratio", "low", "high", "verdict"])


def _case_name(runs: pd.DataFrame) -> str:
    """The case's name ('numpy-matmul-inference-eager-cpu-float32 batch_size=1 n=128'), else its first run's."""
    name = runs.iloc[0].get("case_name")
    return str(name) if isinstance(name, str) and name else str(runs.iloc[0]["run"]).split(" #")[0]


def run(before_source: str, after_source: str, uri: str | None, factor: float = FACTOR) -> list[str]:
    """The lines `runner compare` prints: what differs between the sides, the table, what did not match."""
    from runner.record.table import format_seconds
    from runner.record.table import markdown as table_markdown

    with tempfile.TemporaryDirectory(prefix="runner-compare-") as downloads:
        before, after = load(before_source, uri, Path(downloads)), load(after_source, uri, Path(downloads))
        for side, source in ((before, before_source), (after, after_source)):
            if timed_runs(side).empty:
                statuses = ", ".join(sorted(set(side["status"].map(str)))) if not side.empty else "none"
                runs = f"{len(side)} run{'s' if len(side) != 1 else ''}"
                raise LookupError(f"{source} has no finished, timed run to compare ({runs}: {statuses})")
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
    if alone := unmatched(before, after):
        lines.append(f"not compared, run by one side only: {'; '.join(alone)}")
    return lines


def unmatched(before: pd.DataFrame, after: pd.DataFrame) -> list[str]:
    """Each case that only one side ran, finished and timed, by name and side ('torch-mlp-... batch_size=32: before
    only'): what the table leaves out."""
    before, after = timed_runs(before), timed_runs(after)
    alone = []
    for side, mine, theirs in (("before", before, after), ("after", after, before)):
        alone += [f"{_case_name(runs)}: {side} only" for key, runs in mine.groupby("case", sort=False)
                  if key not in set(theirs["case"])]  # fmt: skip
    return alone

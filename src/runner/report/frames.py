"""Runs as a frame (rows: runs; columns as mlflow.search_runs gives them), each compared with the fastest
run doing the same work in its setup, and the tables a person reads."""

from __future__ import annotations

import math
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from runner import tracking
from runner.measure.samples import PROCESS, ROUND, typical_s
from runner.record import naming, setups
from runner.record.result import RESULT_FILE, Result, ResultUnreadable, Status, read_samples, read_timings
from runner.record.table import COLUMNS, PROSE, Column, present, rows
from runner.record.table import markdown as table_markdown
from runner.report.ratio import (
    ASSUMED,
    UNSTABLE_DISAGREE,
    Job,
    ProcessSpread,
    Verdict,
    describe,
    instability,
    process_count,
    process_spread,
    time_ratio,
)

PANEL_KEYS = ("params.model.name", "params.task.name", "params.batch_size")  # a size sweep shares one panel
SETTING_PREFIXES = ("params.model.", "params.data.")  # the workload's own settings: model.n, data.image_size, ...
# -- loading -------------------------------------------------------------------------------------


def runs_from_dirs(run_dirs: Iterable[Path]) -> pd.DataFrame:
    """One row per run directory that holds a result.json (an unreadable one is a FAILED row saying why)."""
    rows = []
    for run_dir in sorted(Path(d) for d in run_dirs):
        if not Result.exists(run_dir):
            continue
        try:
            result = Result.load(run_dir)
        except ResultUnreadable as error:
            result = Result(status=Status.FAILED, error=str(error))
        name = naming.run_name(result.config, *naming.job_context(run_dir)) if result.config else run_dir.name
        row: dict[str, Any] = {"run": name, "run_dir": str(run_dir), "status": result.status, "error": result.error}
        row["warnings"] = result.warnings
        row.update(setups.environment_columns(result.environment))
        row.update({f"params.{k}": v for k, v in naming.run_params(result.config, result.copied_keys).items()})
        row.update({f"metrics.{k}": v for k, v in result.metrics.items()})
        rows.append(row)
    return _finish_frame(pd.DataFrame(rows))


def sweep_run_dirs(sweep_dir: Path) -> list[Path]:
    """The job directories of a sweep (Hydra's numbered subdirectories), in job order."""
    dirs = [p.parent for p in Path(sweep_dir).glob(f"*/{RESULT_FILE}")]
    return sorted(dirs, key=lambda d: (not d.name.isdigit(), int(d.name) if d.name.isdigit() else 0, d.name))


def runs_from_mlflow(uri: str, experiment: str, parent_run_id: str | None = None) -> pd.DataFrame:
    """The runs of an experiment (only the children of parent_run_id when given; never parent runs)."""
    return runs_from_mlflow_rows(tracking.search_runs(uri, experiment, parent_run_id))


def runs_from_mlflow_rows(rows: list[dict]) -> pd.DataFrame:
    """The frame of runs as tracking.search_runs / runs_of give them."""
    return _finish_frame(pd.DataFrame(rows))


def _finish_frame(frame: pd.DataFrame) -> pd.DataFrame:
    if frame.empty:
        return frame
    for key in ("metrics.time_median_s", "metrics.time_iqr_s"):  # absent when no run was timed
        if key not in frame:
            frame[key] = np.nan
    for key in ("params.batch_size", "params.seed", *(k for k in frame if str(k).startswith(SETTING_PREFIXES))):
        if key in frame and _all_numbers(frame[key]):
            frame[key] = pd.to_numeric(frame[key])
    frame["size"], frame["size_name"] = _sizes(frame)
    frame["setup"] = setups.setups(frame)
    run_dirs = frame.get("run_dir", [None] * len(frame))
    frame["samples_s"] = [read_samples(d) if d else None for d in run_dirs]
    frame["sample_rounds"] = [read_timings(d, ROUND) if d else None for d in run_dirs]
    frame["sample_processes"] = [read_timings(d, PROCESS) if d else None for d in run_dirs]
    return frame


def _all_numbers(column: pd.Series) -> bool:
    """Whether every value given is a number (MLflow hands params back as strings: "1024")."""
    given = column.dropna()
    return not given.empty and pd.to_numeric(given, errors="coerce").notna().all() and given.map(type).ne(bool).all()


def numeric_settings(frame: pd.DataFrame) -> list[str]:
    """The numeric settings of the model or its inputs (params.model.n, params.model.hidden,
    params.data.image_size, ...): runs that differ in one of them did different work."""
    return [k for k in frame if str(k).startswith(SETTING_PREFIXES) and pd.api.types.is_numeric_dtype(frame[k])]


def work_keys(frame: pd.DataFrame) -> list[str]:
    """What two runs must share to be compared: model, task, batch size and the numeric settings of the model
    and its inputs. Everything else is what a comparison is for: backend, mode, device, dtype, and named
    alternatives (model.method of reshape, model.arch of torchvision)."""
    return [k for k in PANEL_KEYS if k in frame] + numeric_settings(frame)


def _sizes(frame: pd.DataFrame) -> tuple[pd.Series, pd.Series]:
    """Per run, its size and the setting that holds it, where exactly one numeric setting varies among the
    runs of its model (a size sweep: model.size of sigmoid, model.n of matmul); NaN and None elsewhere."""
    size, name = pd.Series(np.nan, index=frame.index), pd.Series(None, index=frame.index, dtype=object)
    settings = numeric_settings(frame)
    if "params.model.name" not in frame:
        return size, name
    for _, runs in frame.groupby(frame["params.model.name"].map(str)):
        varying = [k for k in settings if runs[k].nunique() > 1]
        if len(varying) == 1:
            size[runs.index], name[runs.index] = runs[varying[0]], short_name(varying[0])
    return size, name


# -- comparing -----------------------------------------------------------------------------------


NOT_LABELS = ("params.timing.", "params.tracking.")  # how long or where a run was recorded, not what it ran


def varied_params(frame: pd.DataFrame) -> list[str]:
    """The params.* columns whose value differs between runs that have the key: what the sweep varied
    (timing budgets and tracking settings aside)."""
    cols = [c for c in frame.columns if c.startswith("params.") and not c.startswith(NOT_LABELS)]
    return [c for c in cols if frame[c].dropna().map(str).nunique() > 1]


def short_name(column: str) -> str:
    return column.removeprefix("params.").removeprefix("metrics.").removesuffix(".name")


def labels(frame: pd.DataFrame, columns: list[str] | None = None) -> pd.Series:
    """A readable label per run from the parameters that varied: 'backend=torch mode=eager'."""
    columns = varied_params(frame) if columns is None else columns
    if not columns:
        return frame["run"].map(str)
    return frame[columns].map(str).apply(lambda row: " ".join(f"{short_name(c)}={v}" for c, v in row.items()), axis=1)


COMPARISON: tuple[str, ...] = (
    "time_ratio",
    "time_ratio_ci_low",
    "time_ratio_ci_high",
    "verdict",
    "verdict_reason",
    "time_ratio_basis",
)
COMPARISON += ("time_ratio_resolution",)  # the smallest difference the comparison calls 9 times in 10 (ratio.spread)
COMPARED = (*COMPARISON, "within_noise")  # and the verdict with its reason as the table prints it
PROSE_KEYS = ("verdict", "verdict_reason", "within_noise", "time_ratio_basis")


def compare(frame: pd.DataFrame) -> pd.DataFrame:
    """Add `time_ratio` (this run's time / the fastest's), its interval `time_ratio_ci_low`/`_high` (95% over
    the group's comparisons: runner.report.ratio), the `verdict` against the fastest finished run that did
    the same work (work_keys) with its `verdict_reason`, and `within_noise`, the two as the table prints
    them. The fastest is the one with the lowest median. A run whose rounds disagree too much for a verdict
    is UNSTABLE, with why."""
    frame = frame.copy()
    for key in COMPARED:
        frame[key] = None if key in PROSE_KEYS else np.nan
    if frame.empty or "metrics.time_median_s" not in frame:
        return frame
    timed = frame[(frame["status"] == Status.FINISHED) & frame["metrics.time_median_s"].notna()]
    keys = work_keys(frame) + (["setup"] if "setup" in frame else [])
    for _, group in timed.groupby([timed[k].map(str) for k in keys], sort=False):
        fastest = group.apply(_typical, axis=1).idxmin()
        spread = _process_spread(frame, group)
        unstable = {i: _instability(frame.loc[i]) for i in group.index}
        for i in group.index:
            if i == fastest:
                verdict = (Verdict.UNSTABLE, unstable[i]) if unstable[i] else (Verdict.FASTEST, None)
                frame.loc[i, COMPARISON] = [1.0, np.nan, np.nan, *verdict, None, np.nan]
            else:
                no_verdict = (Verdict.UNSTABLE, unstable[i]) if unstable[i] else None
                if no_verdict is None and unstable[fastest]:
                    no_verdict = (Verdict.CANNOT_TELL, "the fastest job is unstable")
                frame.loc[i, COMPARISON] = _versus(frame.loc[i], frame.loc[fastest], len(group) - 1, no_verdict, spread)
            frame.loc[i, "within_noise"] = describe(frame.loc[i, "verdict"], frame.loc[i, "verdict_reason"])
    return frame


def _typical(run: pd.Series) -> float:
    """The run's typical time (runner.measure.samples.typical_s), its median where its samples are not here."""
    if run["samples_s"] is None:
        return run["metrics.time_median_s"]
    return typical_s(run["samples_s"], run.get("sample_rounds"))


def _process_spread(frame: pd.DataFrame, group: pd.DataFrame) -> ProcessSpread:
    """The spread between processes that the group's replicates show (runs differing only in their seed)."""
    runs = group[group["samples_s"].notna()]
    if runs.empty:
        return ASSUMED
    varied = [c for c in varied_params(frame) if c != "params.seed"]
    configurations = labels(runs, varied).tolist() if varied else [""] * len(runs)
    return process_spread([_job(r) for _, r in runs.iterrows()], configurations)


def _job(run: pd.Series) -> Job:
    """The run's samples with their rounds and processes, as runner.report.ratio takes them."""
    return run["samples_s"], run.get("sample_rounds"), run.get("sample_processes")


def _versus(
    run: pd.Series, fastest: pd.Series, comparisons: int, no_verdict: tuple | None, spread: ProcessSpread = ASSUMED
) -> list:
    """time_ratio, its interval, the verdict with its reason, and the basis of `run` against `fastest`;
    `no_verdict` (a verdict and its reason) where one of the two jobs' rounds disagree too much for one."""
    by_medians = run["metrics.time_median_s"] / fastest["metrics.time_median_s"]
    if run["samples_s"] is None or fastest["samples_s"] is None:  # e.g. MLflow runs made on another machine
        return [by_medians, np.nan, np.nan, Verdict.CANNOT_TELL, "no samples", None, np.nan]
    samples = (run["samples_s"], run.get("sample_rounds"), fastest["samples_s"], fastest.get("sample_rounds"))
    processes = (process_count(_job(run)), process_count(_job(fastest)))
    ratio = time_ratio(*samples, comparisons, process_sd=spread.sd, process_df=spread.df, processes=processes)
    by_typical = _typical(run) / _typical(fastest)  # the medians move with a busy machine's slow blocks; these not
    disagree = max(ratio.value / by_typical, by_typical / ratio.value)
    if not no_verdict and disagree > UNSTABLE_DISAGREE:
        no_verdict = (Verdict.UNSTABLE, f"{ratio.value:.2f}x over its rounds, {by_typical:.2f}x by the typical times")
    if (
        no_verdict and no_verdict[0] == Verdict.UNSTABLE
    ):  # rounds that disagree: the ratio the typical times beside it give
        return [by_typical, np.nan, np.nan, *no_verdict, ratio.basis(), np.nan]
    return [ratio.value, ratio.low, ratio.high, *(no_verdict or ratio.verdict()), ratio.basis(), ratio.resolution]


def _instability(run: pd.Series) -> str | None:
    return None if run["samples_s"] is None else instability(run["samples_s"], run.get("sample_rounds"))


def table(frame: pd.DataFrame) -> pd.DataFrame:
    """Raw numbers for runs.csv: run, status, what varied, the table's columns, error."""
    frame = compare(frame)
    records = _records(frame)
    columns = present(COLUMNS, records)
    out = pd.DataFrame({"run": frame["run"].to_numpy(), "status": frame["status"].to_numpy()})
    for key in varied_params(frame):
        out[short_name(key)] = frame[key].to_numpy()
    keys = [c.key for c in columns if c.key not in PROSE]
    keys += [k for k in COMPARED if k not in keys]
    for key in keys:
        out[key] = [r.get(key) for r in records]
    out["error"] = frame["error"].to_numpy() if "error" in frame else None
    return out


def human_table(frame: pd.DataFrame, columns: tuple[Column, ...] = COLUMNS) -> tuple[list[str], list[list[str]]]:
    """Headers and formatted cells (human units): run, status, its setup where runs come from several (see
    setup_notes), what varied, then the table's columns."""
    frame = compare(frame)
    records = _records(frame)
    shown = present(columns, records)
    varied = (["setup"] if frame.get("setup", pd.Series(dtype=int)).nunique() > 1 else []) + varied_params(frame)
    headers = ["run", "status", *(short_name(k) for k in varied), *(c.label for c in shown)]
    cells = [
        [str(row["run"]), str(row["status"]), *(_param_cell(row[k]) for k in varied), *cells]
        for (_, row), cells in zip(frame.iterrows(), rows(shown, records), strict=True)
    ]
    return headers, cells


def _param_cell(value: object) -> str:
    """A parameter as typed: blank where the run has no such key, 1000 rather than 1000.0."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def markdown(frame: pd.DataFrame) -> str:
    """runs.md / summary.md: the human table as markdown, then one line per run that did not finish."""
    text = table_markdown(*human_table(frame)) + "".join(f"\n{line}\n" for line in setup_notes(frame))
    failed = frame[frame["status"] != Status.FINISHED]
    if not failed.empty:
        text += "\n## Not finished\n\n" + "".join(
            f"- {r['run']} ({r['status']}): {r['error']}\n" for _, r in failed.iterrows()
        )
    return text


def setup_notes(frame: pd.DataFrame) -> list[str]:
    """Where the runs come from several setups (machines or versions: runner.record.setups), how each differs."""
    return setups.describe(frame, frame["setup"]) if "setup" in frame else []


def _records(frame: pd.DataFrame) -> list[dict]:
    """Per run, the values the table's columns read: metrics by their own names, and the comparison."""
    records = []
    for _, row in frame.iterrows():
        record = {k.removeprefix("metrics."): v for k, v in row.items() if str(k).startswith("metrics.")}
        record.update({k: row.get(k) for k in COMPARED})
        record["time_ratio_ci"] = (row.get("time_ratio_ci_low"), row.get("time_ratio_ci_high"))
        records.append(record)
    return records

"""Runs as a frame (rows: runs; columns as mlflow.search_runs gives them), each compared with the fastest
run doing the same work in its setup, and the tables a person reads."""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any, cast

import numpy as np
import pandas as pd

from runner.identity import MEASUREMENT, SETTING_PREFIXES, WORK_KEYS, several_hosts, under
from runner.measure.samples import PROCESS, ROUND
from runner.record import setups
from runner.record.result import Status, read_samples, read_timings
from runner.record.runs import Run
from runner.record.table import COLUMNS, PROSE, Column, present, rows
from runner.record.table import markdown as table_markdown
from runner.report.comparison import versus_fastest
from runner.report.ratio import Job
from runner.report.timings import Timings
from runner.tasks import task_class

IDENTITY_COLUMNS = ("work", "configuration", "case", "case_name", "machine", "machine_name", "host")
PANEL_KEYS = tuple(f"params.{k}" for k in WORK_KEYS)  # a size sweep shares one panel
SETTINGS = tuple(f"params.{p}" for p in SETTING_PREFIXES)  # the workload's own settings, as frame columns
# -- loading -------------------------------------------------------------------------------------


def frame(runs: Iterable[Run]) -> pd.DataFrame:
    """One row per run (runner.record.runs: from run or sweep directories, or MLflow), with its identity's keys as
    columns (`work`, `configuration`, `case`, `machine`, `machine_name`, `host`) and its setup."""
    rows = []
    for run in runs:
        row: dict[str, Any] = {"run": run.name, "run_id": run.run_id, "run_dir": run.run_dir, "status": run.status}
        row.update(error=run.error, warnings=list(run.warnings), timed=run.timed, is_control=run.is_control)
        row.update(timed_in=run.timed_in)
        if run.identity is not None:
            row.update({k: v.key for k, v in vars(run.identity).items() if k != "host"})
            row.update(case_name=run.identity.case.name, machine_name=run.identity.machine.name, host=run.host)
        row.update(setups.environment_columns(run.environment))
        row.update({f"params.{k}": v for k, v in run.params.items()})
        row.update({f"metrics.{k}": v for k, v in run.metrics.items()})
        rows.append(row)
    return _finish_frame(pd.DataFrame(rows))


def _finish_frame(frame: pd.DataFrame) -> pd.DataFrame:
    if frame.empty:
        return frame
    for key in ("metrics.time_median_s", "metrics.time_iqr_s"):  # absent when no run was timed
        if key not in frame:
            frame[key] = np.nan
    for key in IDENTITY_COLUMNS:  # absent where every run was refused before it ran
        if key not in frame:
            frame[key] = None
    for key in ("params.batch_size", "params.seed", *(k for k in frame if str(k).startswith(SETTINGS))):
        if key in frame and _all_numbers(frame[key]):
            frame[key] = pd.to_numeric(frame[key])
    frame["size"], frame["size_name"] = _sizes(frame)
    frame["setup"] = setups.setups(frame)
    run_dirs = frame.get("run_dir", [None] * len(frame))
    frame["samples_s"] = [read_samples(d) if d else None for d in run_dirs]
    frame["sample_rounds"] = [read_timings(d, ROUND) if d else None for d in run_dirs]
    frame["sample_processes"] = [read_timings(d, PROCESS) if d else None for d in run_dirs]
    frame["sample_parts"] = [_repeated_parts(row) for _, row in frame.iterrows()]
    return frame


def _repeated_parts(run: pd.Series) -> np.ndarray | None:
    """A run's repeated parts of each call, a row per sample (Task.repeated_parts), where its task times them and its
    tensors.h5 is on this machine."""
    task = task_class(run.get("params.task._target_"), run.get("params.task.name"))
    if task.repeated_parts is None or not run.get("run_dir"):
        return None
    name = task.repeated_parts[0]
    return task.parts_of({name: read_timings(run["run_dir"], name)})


def _all_numbers(column: pd.Series) -> bool:
    """Whether every value given is a number (MLflow hands params back as strings: "1024")."""
    given = column.dropna()
    return not given.empty and pd.to_numeric(given, errors="coerce").notna().all() and given.map(type).ne(bool).all()


def numeric_settings(frame: pd.DataFrame) -> list[str]:
    """The numeric settings of the model or its inputs (params.model.n, params.model.hidden,
    params.data.image_size, ...): runs that differ in one of them did different work."""
    return [k for k in frame if str(k).startswith(SETTINGS) and pd.api.types.is_numeric_dtype(frame[k])]


def work_keys(frame: pd.DataFrame) -> list[str]:
    """The columns of the same-work key (runner.identity.work) that the frame has: what titles a
    panel or a workload."""
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


def varied_params(frame: pd.DataFrame) -> list[str]:
    """The params.* columns whose value differs between runs that have the key: what the sweep varied
    (how it was measured aside: runner.identity.MEASUREMENT)."""
    cols = [c for c in frame.columns if c.startswith("params.") and not under(c.removeprefix("params."), MEASUREMENT)]
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
    "time_ratio_resolution",  # the smallest difference the comparison calls 9 times in 10
)
COMPARED = (*COMPARISON, "within_noise")  # and the verdict with its reason as the table prints it
PROSE_KEYS = ("verdict", "verdict_reason", "within_noise", "time_ratio_basis")


def compare(frame: pd.DataFrame) -> pd.DataFrame:
    """Add each finished run's comparison with the fastest run that did the same work in its setup
    (runner.report.comparison.versus_fastest): `time_ratio`, its interval `time_ratio_ci_low`/`_high`, the
    `verdict` with its `verdict_reason`, `time_ratio_basis` and `time_ratio_resolution`, and `within_noise`, the
    verdict and its reason as the table prints them."""
    frame = frame.copy()
    for key in COMPARED:
        frame[key] = None if key in PROSE_KEYS else np.nan
    if frame.empty or "metrics.time_median_s" not in frame:
        return frame
    timed = timed_runs(frame)
    for _, group in timed.groupby(same_work(timed), sort=False):
        found = versus_fastest([timings(group.loc[[i]]) for i in group.index], group["configuration"].tolist())
        for i, c in zip(group.index, found, strict=True):
            resolution = c.resolution if not math.isnan(c.low) else np.nan  # shown only beside an interval
            frame.loc[i, COMPARISON] = [c.ratio, c.low, c.high, c.verdict, c.reason, c.basis, resolution]
            frame.loc[i, "within_noise"] = c.words()
    return frame


def timed_runs(frame: pd.DataFrame) -> pd.DataFrame:
    """The runs a comparison can use: finished with a timing (runner.record.runs.Run.timed)."""
    return frame[frame["timed"].astype(bool)] if "timed" in frame else frame.iloc[0:0]


def same_work(frame: pd.DataFrame) -> list[pd.Series]:
    """Group keys for runs that did the same work (runner.identity.work) in the same setup."""
    return [frame["work"].map(str), *([frame["setup"].map(str)] if "setup" in frame else [])]


def timings(runs: pd.DataFrame) -> Timings:
    """A run's, or a configuration's replicates', samples as runner.report.comparison takes them (none where one
    of them has no samples on this machine: then the medians stand in)."""
    medians = pd.to_numeric(runs["metrics.time_median_s"]).to_numpy(dtype=float)
    busy = pd.to_numeric(runs.get("metrics.machine_other_runnable", pd.Series(dtype=float))).mean()
    samples = list(runs["samples_s"]) if "samples_s" in runs else [None] * len(runs)
    rounds = list(runs["sample_rounds"]) if "sample_rounds" in runs else [None] * len(runs)
    processes = list(runs["sample_processes"]) if "sample_processes" in runs else [None] * len(runs)
    replicates: tuple[Job, ...] = ()
    if all(s is not None for s in samples):
        replicates = tuple(Job(*job) for job in zip(cast(list[np.ndarray], samples), rounds, processes, strict=True))
    hosts = tuple(runs["host"].fillna("").map(str)) if "host" in runs and replicates else ()
    timed_in = tuple(runs["timed_in"].map(str)) if "timed_in" in runs and replicates else ()
    parts = list(runs["sample_parts"]) if "sample_parts" in runs else []
    found = tuple(parts) if replicates and parts and all(p is not None for p in parts) else ()
    busy = 0.0 if pd.isna(busy) else float(busy)
    return Timings(replicates, tuple(medians.tolist()), busy, hosts, found, timed_in)


def table(frame: pd.DataFrame) -> pd.DataFrame:
    """Raw numbers for runs.csv: run, status, what varied, the table's columns, error."""
    frame = compare(frame)
    records = table_records(frame)
    columns = present(COLUMNS, records)
    out = pd.DataFrame({"run": frame["run"].to_numpy(), "status": frame["status"].to_numpy()})
    for key in host_column(frame) + varied_params(frame):
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
    records = table_records(frame)
    shown = present(columns, records)
    varied = (["setup"] if frame.get("setup", pd.Series(dtype=int)).nunique() > 1 else []) + host_column(frame)
    varied += varied_params(frame)
    headers = ["run", "status", *(short_name(k) for k in varied), *column_labels(shown, frame)]
    cells = [
        [str(row["run"]), str(row["status"]), *(param_cell(row[k]) for k in varied), *cells]
        for (_, row), cells in zip(frame.iterrows(), rows(shown, records), strict=True)
    ]
    return headers, cells


def host_column(frame: pd.DataFrame) -> list[str]:
    """The host column, where the runs ran on more than one host (a cluster's nodes, a team's machines)."""
    return ["host"] if "host" in frame and several_hosts(frame["host"]) else []


def column_labels(columns: list[Column], frame: pd.DataFrame) -> list[str]:
    """The columns' headings, a task's part (Task.part: a token's time) said as the median it is: 'per token
    (median)'. A comparison of parts compares their typical time (runner.report.pooled.part_typical_s), which a busy
    machine can set far from the median of every part."""
    pairs = {(row.get("params.task._target_"), row.get("params.task.name")) for _, row in frame.iterrows()}
    parts = {task.part[0] for task in (task_class(*pair) for pair in pairs) if task.part is not None}
    return [f"{c.label} (median)" if c.key in parts else c.label for c in columns]


def param_cell(value: object) -> str:
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


def table_records(frame: pd.DataFrame) -> list[dict]:
    """Per run, the values the table's columns read: metrics by their own names, and the comparison."""
    records = []
    for _, row in frame.iterrows():
        record = {k.removeprefix("metrics."): v for k, v in row.items() if str(k).startswith("metrics.")}
        record.update({k: row.get(k) for k in COMPARED})
        record["time_ratio_ci"] = (row.get("time_ratio_ci_low"), row.get("time_ratio_ci_high"))
        records.append(record)
    return records

"""Logging a run directory to MLflow, now (track) or later (sync): params, metrics with every timing
sample, tags, description, files; one MLflow run per run_key, a partial upload replaced, never doubled."""

from __future__ import annotations

import contextlib
import math
import sys
import time
import warnings
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from runner.config import first_line
from runner.record.naming import job_context, run_name, run_params
from runner.record.result import (
    ERROR_LOG,
    LOG_FILE,
    PROFILE_FILE,
    PROFILE_SUMMARY,
    PROFILE_TRACE,
    RESULT_FILE,
    TENSORS_FILE,
    Result,
    Status,
    read_inputs,
    read_samples,
    read_timings,
)
from runner.record.runs import control_tag
from runner.record.sweep_file import SWEEP_FILE
from runner.tasks import builtin_metrics
from runner.tracking.link import TRACKING_FILE, read_link, read_link_or_empty, run_key, write_link
from runner.tracking.run_page import TRACE, microseconds, note_content, ui_metric
from runner.tracking.store import check_reachable, client, ensure_experiment, open_store, retry_on_lock

RUN_KEY_TAG = "runner.run_key"  # the run directory + its start: one MLflow run per key
NO_RESULT = "the run's processes ended before it recorded a result (found by runner sync)"


def log_to_mlflow(run_dir: Path, uri: str, experiment: str, parent_run_id: str | None = None) -> str:
    """Create one MLflow run from the files in run_dir, spanning the job's own start and end; returns its id."""
    open_store(uri)

    run_dir = Path(run_dir)
    result = Result.load(run_dir)
    mlflow = client(uri)
    experiment_id = ensure_experiment(mlflow, uri, experiment)
    ended_ms = _ms(result.ended) or int(time.time() * 1000)
    started_ms = _ms(result.started) or ended_ms
    tags = run_tags(run_dir, result, parent_run_id)
    link = read_link(run_dir)
    tags[RUN_KEY_TAG] = link.get("run_key") or run_key(run_dir)
    _remove_partial_uploads(mlflow, experiment_id, tags[RUN_KEY_TAG], link.get("run_id"))
    run = retry_on_lock(mlflow.create_run, experiment_id, start_time=started_ms, tags=tags)
    run_id = run.info.run_id
    write_link(run_dir, {**link, "uri": uri, "experiment": experiment, "run_id": run_id, "synced": False})
    try:
        _log_contents(mlflow, run_id, run_dir, result, ended_ms)
    except BaseException:
        _end_failed(mlflow, run_id)
        raise
    retry_on_lock(mlflow.set_terminated, run_id, result.status, end_time=max(ended_ms, started_ms))
    return run_id


def _end_failed(mlflow, run_id: str) -> None:
    """A run whose upload broke off ends FAILED, never stays RUNNING; the next sync replaces it."""
    with contextlib.suppress(Exception):
        mlflow.set_terminated(run_id, Status.FAILED)


def _remove_partial_uploads(mlflow, experiment_id: str, key: str, noted_run_id: str | None) -> None:
    """Delete the runs an earlier, broken-off upload of this run directory left (so sync never doubles)."""
    found = retry_on_lock(mlflow.search_runs, [experiment_id], filter_string=f"tags.`{RUN_KEY_TAG}` = '{key}'")
    run_ids = {run.info.run_id for run in found}
    if noted_run_id:
        run_ids.add(noted_run_id)
    for run_id in run_ids:
        with contextlib.suppress(Exception):  # already deleted, or in another store
            retry_on_lock(mlflow.delete_run, run_id)


def _log_contents(mlflow, run_id: str, run_dir: Path, result: Result, ended_ms: int) -> None:
    """Params, metrics (with the timing trace, TRACE), the dataset input and the files of a run."""
    from mlflow.entities import Param

    params = [Param(k, v[:6000]) for k, v in run_params(result.config, result.copied_keys).items()]
    metrics = _metrics(result, read_samples(run_dir), read_timings(run_dir, "sample_end_unix_s"), ended_ms)
    for chunk in range(0, max(len(metrics), 1), 1000):  # log_batch takes at most 1000 metrics
        batch_params = params if chunk == 0 else []  # the params once, with the first batch
        retry_on_lock(mlflow.log_batch, run_id, metrics=metrics[chunk : chunk + 1000], params=batch_params)
    dataset = dataset_input(run_dir, result)
    if dataset is not None:
        retry_on_lock(mlflow.log_inputs, run_id, datasets=[dataset])
    _log_run_files(mlflow, run_id, run_dir)


def _ms(epoch_s: float | None) -> int | None:
    return int(epoch_s * 1000) if epoch_s else None


def run_tags(run_dir: Path, result: Result, parent_run_id: str | None) -> dict[str, str]:
    """MLflow's standard tags (name, source, commit, user, description), env.* once each, and why a job failed."""
    env = result.environment
    swept, job = job_context(run_dir)
    tags = {
        "mlflow.runName": run_name(result.config, swept, job),
        "mlflow.source.type": "LOCAL",
        "mlflow.source.name": "run.py",
        "mlflow.user": env.get("user") or user_name(),
        "mlflow.note.content": note_content(result),
        "run_dir": str(run_dir.resolve()),
        **{f"env.{k}": str(v)[:5000] for k, v in env.items() if not _duplicate(k, env)},
    }
    tags.update(git_tags(env))
    found = result.identity()
    if found:  # what it is the same as: its comparisons, replicates, history series and machine (runner.identity)
        tags.update(found.tags())
    tags.update(control_tag(run_dir, result))  # the case of the control its sweep timed beside it
    if result.error:
        tags["error"] = result.error[:5000]
    if result.output_tail:
        tags["output_tail"] = result.output_tail[-5000:]
    if parent_run_id:
        tags["mlflow.parentRunId"] = parent_run_id
    return tags


GIT_TAGS = {
    "git_commit": "mlflow.source.git.commit",
    "git_branch": "mlflow.source.git.branch",
    "git_dirty": "mlflow.source.git.dirty",
}


def git_tags(source: dict) -> dict[str, str]:
    """MLflow's source tags (commit, branch, dirty) from a run's git_* facts (runner.record.environment.git_source)."""
    return {tag: str(source[key]) for key, tag in GIT_TAGS.items() if source.get(key, "unknown") != "unknown"}


def _duplicate(key: str, env: dict) -> bool:
    """git_* are MLflow's mlflow.source.git.* tags; a CPU run's device_name repeats env.cpu."""
    return key in GIT_TAGS or (key == "device_name" and env.get("device_name") == env.get("cpu"))


def user_name() -> str:
    import getpass

    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return "unknown"


def _metrics(result: Result, samples, sample_ends, ended_ms: int) -> list:
    """The metrics at the job's end (ui_metric), and every timing sample as the steps of TRACE (the UI's
    timing trace), each stamped with the moment it ended (the job's end where a run did not record that)."""
    from mlflow.entities import Metric

    numbers = {k: float(v) for k, v in result.metrics.items() if isinstance(v, int | float)}
    # logged first: the time comparisons use, then the task's own; MLflow's compare page draws the first by default
    first = {k: i for i, k in enumerate(("time_typical_s", *(m.key for m in builtin_metrics())))}
    ordered = sorted(numbers, key=lambda k: first.get(k, len(first)))  # stable: the rest as the record has them
    shown = [m for m in (ui_metric(k, numbers[k]) for k in ordered) if m is not None]
    metrics = [Metric(name, value, ended_ms, 0) for name, value in shown]
    if samples is None:
        return metrics
    if sample_ends is None or len(sample_ends) != len(samples):
        sample_ends = [ended_ms / 1000] * len(samples)
    stamped = enumerate(zip(samples, sample_ends, strict=True))
    return metrics + [Metric(TRACE, microseconds(v), _ms(end) or ended_ms, step) for step, (v, end) in stamped]


def dataset_input(run_dir: Path, result: Result):
    """The run's inputs as an MLflow dataset: its file (or the seed that made it), digest and shape."""
    from mlflow.data.numpy_dataset import from_numpy  # what mlflow.data.from_numpy is, by a name mypy sees
    from mlflow.entities import DatasetInput, InputTag

    arrays = read_inputs(run_dir)
    if not arrays:
        return None
    data = result.config.get("data") or {}
    path = data.get("path")
    source = str(Path(path).resolve()) if path else str((run_dir / TENSORS_FILE).resolve())
    described = Path(path).name if path else f"seeded random (seed {result.config.get('seed')})"
    name = f"{data.get('name', 'inputs')}: {described}"
    with warnings.catch_warnings():  # a local path matches two equivalent source classes; either will do
        warnings.simplefilter("ignore", UserWarning)
        dataset = from_numpy(arrays, source=source, name=name[:500])
    task = (result.config.get("task") or {}).get("name", "")
    return DatasetInput(dataset._to_mlflow_entity(), tags=[InputTag("mlflow.data.context", task)])


def append_to_note(uri: str, run_id: str, line: str) -> None:
    """Add a line to a run's description (a sweep adds how each job compares once all have run)."""
    mlflow = client(uri)
    description = retry_on_lock(mlflow.get_run, run_id).data.tags.get("mlflow.note.content", "")
    retry_on_lock(mlflow.set_tag, run_id, "mlflow.note.content", f"{description}  \n{line}"[:5000])


def log_comparison(uri: str, run_id: str, metrics: dict[str, float], line: str) -> None:
    """A sweep's comparison of one of its jobs: metrics (NaN ones left out) and a line in its description."""

    mlflow = client(uri)
    for key, value in metrics.items():
        if not math.isnan(value):
            retry_on_lock(mlflow.log_metric, run_id, key, value)
    append_to_note(uri, run_id, line)


def _log_run_files(mlflow, run_id: str, run_dir: Path) -> None:
    for name in (RESULT_FILE, TENSORS_FILE, LOG_FILE, ERROR_LOG, PROFILE_FILE, PROFILE_SUMMARY, PROFILE_TRACE):
        if (run_dir / name).exists() and (run_dir / name).stat().st_size:  # an empty job.log is no artifact
            retry_on_lock(mlflow.log_artifact, run_id, str(run_dir / name))
    for folder, artifact_path in ((".hydra", "hydra"), ("images", "images")):
        if (run_dir / folder).is_dir():
            retry_on_lock(mlflow.log_artifacts, run_id, str(run_dir / folder), artifact_path)


def track(run_dir: Path, uri: str, experiment: str, parent_run_id: str | None = None) -> str | None:
    """Log run_dir to MLflow; on failure keep everything local, say so, and leave a link for sync."""
    link = {"uri": uri, "experiment": experiment, "parent_run_id": parent_run_id}
    try:
        check_reachable(uri)
        run_id = log_to_mlflow(run_dir, uri, experiment, parent_run_id)
    except Exception as error:  # the store is down, locked or unreachable: results stay on disk
        reason = first_line(error)
        write_link(run_dir, {**read_link_or_empty(run_dir), **link, "synced": False, "error": reason})
        whole = run_dir.parent if (run_dir.parent / SWEEP_FILE).exists() else run_dir  # a sweep: its parent run too
        print(
            f"warning: could not log to MLflow at {uri} ({reason}); results are kept in {run_dir} "
            f"-- upload them later with: runner sync {whole}",
            file=sys.stderr,
        )
        return None
    write_link(run_dir, {**read_link(run_dir), **link, "run_id": run_id, "synced": True})
    return run_id


class SyncState(StrEnum):
    UPLOADED = "uploaded"
    ALREADY = "already in MLflow"
    CREATED = "created"  # a sweep's parent run, made at sync
    FAILED = "error"


@dataclass(frozen=True)
class Synced:
    """What `runner sync` did with one directory: its state, and the line a person reads."""

    path: Path
    state: SyncState
    detail: str = ""  # the run id, or what went wrong

    def line(self) -> str:
        text = {
            SyncState.UPLOADED: f"uploaded as run {self.detail}",
            SyncState.ALREADY: str(SyncState.ALREADY),
            SyncState.CREATED: f"parent run {self.detail} created",
            SyncState.FAILED: f"error: {self.detail}",
        }[self.state]
        return f"{self.path}: {text}"


def sync_one(run_dir: Path, uri: str | None) -> Synced:
    """`sync`, whatever happens: an error is a FAILED Synced, not an exception."""
    try:
        run_id = sync(run_dir, uri)
    except Exception as error:
        return Synced(run_dir, SyncState.FAILED, first_line(error))
    return Synced(run_dir, SyncState.ALREADY) if run_id is None else Synced(run_dir, SyncState.UPLOADED, run_id)


def sync(run_dir: Path, uri: str | None = None) -> str | None:
    """Upload a run that could not reach its store when it ran (or whose processes were killed); returns
    the new run id, None when it is in MLflow already."""
    run_dir = Path(run_dir)
    link = read_link(run_dir)
    if not link:
        raise FileNotFoundError(f"{run_dir} has no {TRACKING_FILE}: it was not a tracked run")
    if link.get("synced"):
        return None
    if not Result.exists(run_dir):  # the worker and its launcher died before recording anything
        Result(status=Status.KILLED, error=NO_RESULT).save(run_dir)
    uri = uri or link["uri"]
    check_reachable(uri)
    run_id = log_to_mlflow(run_dir, uri, link["experiment"], link.get("parent_run_id"))
    write_link(run_dir, {**read_link(run_dir), "run_id": run_id, "synced": True, "error": None, "uri": uri})
    return run_id


NOTE_LIMIT = 5000  # characters of a run's description (an MLflow tag) this runner writes


def fit_note(text: str, limit: int = NOTE_LIMIT) -> str:
    """text cut to whole lines within `limit`, saying where the rest is (a sweep's table of many jobs)."""
    if len(text) <= limit:
        return text
    more = "\n\n(cut here: the whole table is summary.md among the run's artifacts)"
    return text[: text.rfind("\n", 0, limit - len(more))] + more


def log_files(uri: str, run_id: str, files: list[Path], artifact_path: str | None = None) -> None:
    mlflow = client(uri)
    for path in files:
        if Path(path).exists():
            retry_on_lock(mlflow.log_artifact, run_id, str(path), artifact_path)

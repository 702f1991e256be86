"""MLflow: every call to it is here. Runs, sweep parent runs, searches for reports, later uploads.

A run is complete in its directory (result.json, tensors.h5: runner.result) before MLflow is touched;
MLflow is fed from the run directory alone, so a run that could not reach its tracking store
when it ran is uploaded later, unchanged, by `runner sync RUN_DIR`.
"""

from __future__ import annotations

import gc
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

from runner.config import first_line, is_capability
from runner.result import RESULT_FILE, TENSORS_FILE, Result

TRACKING_FILE = "tracking.json"  # where (and whether) the run reached MLflow
# A tracking server that is down should cost seconds, not MLflow's default minutes of retries.
os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "2")
os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "20")


# -- MLflow ------------------------------------------------------------------------------------


def flatten(config: dict, prefix: str = "") -> dict[str, str]:
    """{"a": {"b": 1}} -> {"a.b": "1"}: MLflow params are flat strings."""
    flat: dict[str, str] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.update(flatten(value, f"{name}."))
        else:
            flat[name] = str(value)
    return flat


def run_params(config: dict) -> dict[str, str]:
    """The run's parameters: its flattened config without the capability data (runner.config)."""
    return {k: v for k, v in flatten(config).items() if not is_capability(k)}


def run_name(config: dict) -> str:
    return "-".join(str(_choice(config, key)) for key in ("backend", "model", "task", "mode", "device", "dtype"))


def _choice(config: dict, key: str):
    value = config.get(key)
    return value.get("name") if isinstance(value, dict) else value


def open_store(uri: str) -> None:
    """Import MLflow and open the store at `uri` (MLflow caches it): the slow part of logging a run.

    The garbage collector is paused meanwhile, then told to leave what was loaded alone (gc.freeze):
    importing MLflow's ~2,000 modules triggers collections that find nothing to free, and a later full
    collection over them would cost every later run again (measured in BENCHMARKS.md, start-up).
    """
    first_time, collecting = "mlflow.tracking" not in sys.modules, gc.isenabled()
    gc.disable()
    try:
        from mlflow.entities import Metric, Param, RunTag  # noqa: F401 - imported here, used by log_to_mlflow

        retry_on_lock(client, uri)  # opens a database store; a server is not contacted
        if first_time:  # later jobs of a sweep freeze nothing more: their garbage stays collectable
            gc.freeze()
    finally:
        if collecting:
            gc.enable()


def client(uri: str):
    """An MlflowClient for `uri` (MLflow caches the store behind it)."""
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=uri)


def log_to_mlflow(run_dir: Path, uri: str, experiment: str, parent_run_id: str | None = None) -> str:
    """Create one MLflow run from the files in run_dir; returns its run id."""
    open_store(uri)
    from mlflow.entities import Metric, Param, RunTag

    run_dir = Path(run_dir)
    result = Result.load(run_dir)
    mlflow = client(uri)
    experiment_id = ensure_experiment(mlflow, uri, experiment)
    env = result.environment
    tags = {
        "mlflow.runName": run_name(result.config),
        "git_commit": env.get("git_commit", "unknown"),
        "device_name": env.get("device_name", "unknown"),
        "cpu": env.get("cpu", "unknown"),
        "python": env.get("python", "unknown"),
        "framework": env.get("framework", "unknown"),
        "framework_version": env.get("framework_version", "unknown"),
        "run_dir": str(run_dir.resolve()),
    }
    if result.error:
        tags["error"] = result.error[:5000]
    if result.output_tail:
        tags["output_tail"] = result.output_tail[-5000:]
    if parent_run_id:
        tags["mlflow.parentRunId"] = parent_run_id
    run = retry_on_lock(mlflow.create_run, experiment_id, tags=tags)
    run_id = run.info.run_id
    now = int(time.time() * 1000)
    metrics = [Metric(k, float(v), now, 0) for k, v in result.metrics.items() if isinstance(v, int | float)]
    params = [Param(k, v[:6000]) for k, v in run_params(result.config).items()]
    env_tags = [RunTag(f"env.{k}", str(v)[:5000]) for k, v in env.items()]
    retry_on_lock(mlflow.log_batch, run_id, metrics=metrics, params=params, tags=env_tags)
    for name in (RESULT_FILE, TENSORS_FILE, "job.log", "error.log"):
        if (run_dir / name).exists():
            retry_on_lock(mlflow.log_artifact, run_id, str(run_dir / name))
    for folder, artifact_path in ((".hydra", "hydra"), ("images", "images")):
        if (run_dir / folder).is_dir():
            retry_on_lock(mlflow.log_artifacts, run_id, str(run_dir / folder), artifact_path)
    retry_on_lock(mlflow.set_terminated, run_id, result.status)
    return run_id


def ensure_experiment(mlflow, uri: str, name: str) -> str:
    """The experiment's id, creating it (artifacts beside a local SQLite store) if it is new."""
    from mlflow.exceptions import MlflowException

    existing = retry_on_lock(mlflow.get_experiment_by_name, name)
    if existing is not None:
        return existing.experiment_id
    try:
        return retry_on_lock(mlflow.create_experiment, name, artifact_location=_artifact_location(uri, name))
    except MlflowException:  # created meanwhile by a parallel job
        return retry_on_lock(mlflow.get_experiment_by_name, name).experiment_id


def _artifact_location(uri: str, experiment: str) -> str | None:
    if not uri.startswith("sqlite:///"):
        return None  # a server or file store chooses its own
    db = Path(uri.removeprefix("sqlite:///"))
    return (db.parent / "mlartifacts" / experiment).resolve().as_uri()


def retry_on_lock(call: Callable, *args, attempts: int = 8, **kwargs):
    """Call an MLflow client method, retrying while a shared SQLite store is locked."""
    for attempt in range(attempts):
        try:
            return call(*args, **kwargs)
        except Exception as error:
            if "locked" not in str(error).lower() or attempt == attempts - 1:
                raise
            time.sleep(0.2 * 2**attempt)
    raise AssertionError("unreachable")


def track(run_dir: Path, uri: str, experiment: str, parent_run_id: str | None = None) -> str | None:
    """Log run_dir to MLflow; on failure keep everything local, say so, and leave a note for sync."""
    note = {"uri": uri, "experiment": experiment, "parent_run_id": parent_run_id}
    try:
        check_reachable(uri)
        run_id = log_to_mlflow(run_dir, uri, experiment, parent_run_id)
    except Exception as error:  # the store is down, locked or unreachable: results stay on disk
        reason = first_line(error)
        note.update(run_id=None, synced=False, error=reason)
        (Path(run_dir) / TRACKING_FILE).write_text(json.dumps(note, indent=2) + "\n")
        print(
            f"warning: could not log to MLflow at {uri} ({reason}); results are kept in {run_dir} "
            f"-- upload them later with: runner sync {run_dir}",
            file=sys.stderr,
        )
        return None
    note.update(run_id=run_id, synced=True)
    (Path(run_dir) / TRACKING_FILE).write_text(json.dumps(note, indent=2) + "\n")
    return run_id


def check_reachable(uri: str, timeout_s: float = 5.0) -> None:
    """Fail fast when a tracking server does not answer: MLflow's own retries would wait minutes."""
    if not uri.startswith(("http://", "https://")):
        return
    import urllib.error
    import urllib.request

    try:
        urllib.request.urlopen(f"{uri.rstrip('/')}/health", timeout=timeout_s).close()
    except urllib.error.HTTPError:
        return  # it answered (perhaps asking for credentials): MLflow's client takes it from here
    except OSError as error:
        raise ConnectionError(f"tracking server {uri} does not answer ({error})") from None


def sync(run_dir: Path, uri: str | None = None) -> str | None:
    """Upload a run that could not reach its store when it ran; returns the new run id."""
    note_path = Path(run_dir) / TRACKING_FILE
    if not note_path.exists():
        raise FileNotFoundError(f"{run_dir} has no {TRACKING_FILE}: it was not a tracked run")
    note = json.loads(note_path.read_text())
    if note.get("synced"):
        return None
    check_reachable(uri or note["uri"])
    run_id = log_to_mlflow(Path(run_dir), uri or note["uri"], note["experiment"], note.get("parent_run_id"))
    note.update(run_id=run_id, synced=True, error=None, uri=uri or note["uri"])
    note_path.write_text(json.dumps(note, indent=2) + "\n")
    return run_id


# -- sweeps: a parent run, and reports over runs ------------------------------------------------


def create_parent_run(note: dict) -> str:
    """The parent run of a sweep (`note` is its sweep.json); its params are the sweep's overrides."""
    check_reachable(note["uri"])
    open_store(note["uri"])
    from mlflow.entities import Param

    mlflow = client(note["uri"])
    experiment_id = ensure_experiment(mlflow, note["uri"], note["experiment"])
    sweep_dir = Path(note["sweep_dir"])
    tags = {
        "mlflow.runName": f"sweep {sweep_dir.parent.name}/{sweep_dir.name}",
        "sweep_dir": note["sweep_dir"],
        "launcher": note["launcher"],
        "overrides": " ".join(note["overrides"])[:5000],
    }
    run = retry_on_lock(mlflow.create_run, experiment_id, tags=tags)
    params = [Param(k, v) for k, v in dict(_split_override(o) for o in note["overrides"]).items()]  # last wins
    if params:
        retry_on_lock(mlflow.log_batch, run.info.run_id, params=params)
    return run.info.run_id


def _split_override(override: str) -> tuple[str, str]:
    key, _, value = override.partition("=")
    return key.lstrip("+~"), value[:6000]


def close_parent_run(uri: str, run_id: str, counts: dict[str, int], files: list[Path], status: str) -> None:
    """Log a sweep's job counts and summary files to its parent run and end it with `status`."""
    from mlflow.entities import Metric

    mlflow = client(uri)
    now = int(time.time() * 1000)
    retry_on_lock(mlflow.log_batch, run_id, metrics=[Metric(k, float(v), now, 0) for k, v in counts.items()])
    log_files(uri, run_id, [p for p in files if p.parent.name != "report"])
    log_files(uri, run_id, [p for p in files if p.parent.name == "report"], "report")
    retry_on_lock(mlflow.set_terminated, run_id, status)


def log_files(uri: str, run_id: str, files: list[Path], artifact_path: str | None = None) -> None:
    mlflow = client(uri)
    for path in files:
        if Path(path).exists():
            retry_on_lock(mlflow.log_artifact, run_id, str(path), artifact_path)


def search_runs(uri: str, experiment: str, parent_run_id: str | None = None) -> list[dict]:
    """The measurement runs of an experiment (only the children of parent_run_id when given), oldest
    first, as {"run", "run_id", "run_dir", "status", "error", "parent_run_id", "params.*", "metrics.*"}."""
    mlflow = client(uri)
    found = mlflow.get_experiment_by_name(experiment)
    if found is None:
        raise LookupError(f"no experiment named {experiment!r} at {uri}")
    query = f"tags.mlflow.parentRunId = '{parent_run_id}'" if parent_run_id else ""
    rows = []
    runs = mlflow.search_runs([found.experiment_id], filter_string=query, max_results=50_000)
    for run in sorted(runs, key=lambda r: r.info.start_time):
        tags = run.data.tags
        if "sweep_dir" in tags:  # a sweep's parent run, not a measurement
            continue
        row = {
            "run": run.info.run_id[:8],
            "run_id": run.info.run_id,
            "run_dir": tags.get("run_dir"),
            "status": run.info.status,
            "error": tags.get("error"),
            "parent_run_id": tags.get("mlflow.parentRunId"),
        }
        row.update({f"params.{k}": v for k, v in run.data.params.items()})
        row.update({f"metrics.{k}": v for k, v in run.data.metrics.items()})
        rows.append(row)
    return rows

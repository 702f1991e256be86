"""Recording: result.json and tensors.h5 in the run directory, then (optionally) an MLflow run.

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

import numpy as np

RESULT_FILE = "result.json"
TENSORS_FILE = "tensors.h5"
TRACKING_FILE = "tracking.json"  # where (and whether) the run reached MLflow
# A tracking server that is down should cost seconds, not MLflow's default minutes of retries.
os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "2")
os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "20")


def write_result(run_dir: Path, result: dict) -> Path:
    path = Path(run_dir) / RESULT_FILE
    path.write_text(json.dumps(result, indent=2, default=_json_default) + "\n")
    return path


def read_result(run_dir: Path) -> dict:
    return json.loads((Path(run_dir) / RESULT_FILE).read_text())


def _json_default(value):
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    return str(value)


def write_tensors(run_dir: Path, tensors: dict[str, np.ndarray], attrs: dict) -> Path:
    """tensors.h5: datasets at their paths ("inputs/x", "gradients/dense.weight", ...), root attrs."""
    import h5py

    path = Path(run_dir) / TENSORS_FILE
    with h5py.File(path, "w") as f:
        for name, array in tensors.items():
            f.create_dataset(name, data=np.asarray(array))
        for key, value in attrs.items():
            f.attrs[key] = value if isinstance(value, str | int | float) else json.dumps(value, default=str)
    return path


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


def run_name(config: dict) -> str:
    return "-".join(str(_choice(config, key)) for key in ("backend", "model", "task", "mode", "device", "dtype"))


def _choice(config: dict, key: str):
    value = config.get(key)
    return value.get("name") if isinstance(value, dict) else value


def open_store(uri: str) -> None:
    """Import MLflow and open the store at `uri` (MLflow caches it): the slow part of logging a run.

    The garbage collector is paused meanwhile, then told to leave what was loaded alone (gc.freeze):
    importing MLflow's ~2,000 modules triggers collections that find nothing to free (1.7 s -> 1.2 s
    for a local SQLite store), and a later full collection over them costs 0.2 s more per run.
    """
    first_time, collecting = "mlflow.tracking" not in sys.modules, gc.isenabled()
    gc.disable()
    try:
        from mlflow.entities import Metric, Param, RunTag  # noqa: F401 - imported here, used by log_to_mlflow
        from mlflow.tracking import MlflowClient

        retry_on_lock(MlflowClient, tracking_uri=uri)  # opens a database store; a server is not contacted
        if first_time:  # later jobs of a sweep freeze nothing more: their garbage stays collectable
            gc.freeze()
    finally:
        if collecting:
            gc.enable()


def log_to_mlflow(run_dir: Path, uri: str, experiment: str, parent_run_id: str | None = None) -> str:
    """Create one MLflow run from the files in run_dir; returns its run id."""
    open_store(uri)
    from mlflow.entities import Metric, Param, RunTag
    from mlflow.tracking import MlflowClient

    run_dir = Path(run_dir)
    result = read_result(run_dir)
    client = MlflowClient(tracking_uri=uri)
    experiment_id = ensure_experiment(client, uri, experiment)
    env = result.get("environment", {})
    tags = {
        "mlflow.runName": run_name(result["config"]),
        "git_commit": env.get("git_commit", "unknown"),
        "device_name": env.get("device_name", "unknown"),
        "cpu": env.get("cpu", "unknown"),
        "python": env.get("python", "unknown"),
        "framework": env.get("framework", "unknown"),
        "framework_version": env.get("framework_version", "unknown"),
        "run_dir": str(run_dir.resolve()),
    }
    if "error" in result:
        tags["error"] = result["error"][:5000]
    if "output_tail" in result:
        tags["output_tail"] = result["output_tail"][-5000:]
    if parent_run_id:
        tags["mlflow.parentRunId"] = parent_run_id
    run = retry_on_lock(client.create_run, experiment_id, tags=tags)
    run_id = run.info.run_id
    now = int(time.time() * 1000)
    metrics = [Metric(k, float(v), now, 0) for k, v in result["metrics"].items() if isinstance(v, int | float)]
    params = [Param(k, v[:6000]) for k, v in flatten(result["config"]).items()]
    env_tags = [RunTag(f"env.{k}", str(v)[:5000]) for k, v in env.items()]
    retry_on_lock(client.log_batch, run_id, metrics=metrics, params=params, tags=env_tags)
    for name in (RESULT_FILE, TENSORS_FILE, "job.log", "error.log"):
        if (run_dir / name).exists():
            retry_on_lock(client.log_artifact, run_id, str(run_dir / name))
    for folder, artifact_path in ((".hydra", "hydra"), ("images", "images")):
        if (run_dir / folder).is_dir():
            retry_on_lock(client.log_artifacts, run_id, str(run_dir / folder), artifact_path)
    retry_on_lock(client.set_terminated, run_id, result["status"])
    return run_id


def ensure_experiment(client, uri: str, name: str) -> str:
    """The experiment's id, creating it (artifacts beside a local SQLite store) if it is new."""
    from mlflow.exceptions import MlflowException

    existing = retry_on_lock(client.get_experiment_by_name, name)
    if existing is not None:
        return existing.experiment_id
    try:
        return retry_on_lock(client.create_experiment, name, artifact_location=_artifact_location(uri, name))
    except MlflowException:  # created meanwhile by a parallel job
        return retry_on_lock(client.get_experiment_by_name, name).experiment_id


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
        reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
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

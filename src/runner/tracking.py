"""MLflow: every call to it is here. Runs, sweep parent runs, searches for reports, later uploads.

A run is complete in its directory (result.json, tensors.h5: runner.result) before MLflow is touched;
MLflow is fed from the run directory alone, so a run that could not reach its tracking store
when it ran is uploaded later, unchanged, by `runner sync RUN_DIR`.

Nothing is lost and nothing is doubled: a pending tracking.json (uri, experiment, parent, a stable
`run_key`) is written before the job starts; each MLflow run carries the tag `runner.run_key`, and its
id is noted as soon as it exists, so a later sync replaces a partial upload instead of adding a copy.
A new SQLite store is created by one process at a time (an flock beside the database).
"""

from __future__ import annotations

import contextlib
import fcntl
import gc
import hashlib
import json
import logging
import os
import sys
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path

from runner.config import ConfigError, first_line, is_capability
from runner.result import RESULT_FILE, TENSORS_FILE, Result, read_inputs, read_samples, read_timings

TRACKING_FILE = "tracking.json"  # where (and whether) the run reached MLflow
RUN_KEY_TAG = "runner.run_key"  # the run directory + its start: one MLflow run per key
NO_RESULT = "the run's processes ended before it recorded a result (found by runner sync)"
# A tracking server that is down should cost seconds, not MLflow's default minutes of retries.
os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "2")
os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "20")
# A fresh SQLite store announces its migrations at INFO: start-up noise, not news for the user.
for _logger in ("mlflow.store.db.utils", "alembic"):
    logging.getLogger(_logger).setLevel(logging.WARNING)


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
    """The run's parameters: the flattened config keys that apply to its model, data and mode.

    Left out: capability data (runner.config), where the run was logged (tracking.*), data settings the
    chosen data or model does not read, and model settings that copy another key by interpolation
    (model.image_size = ${data.image_size}, model.backend_module = ${backend.module}). The whole resolved
    config stays in result.json and the Hydra artifacts."""
    flat = flatten(config)
    return {k: v for k, v in flat.items() if _applies(k, config) and not _copies_another_key(k, flat)}


def _copies_another_key(key: str, flat: dict[str, str]) -> bool:
    """model.X whose value is that of the key X names elsewhere (data.X, or X with "_" for "." as backend_module)."""
    if not key.startswith("model."):
        return False
    name = key.removeprefix("model.")
    return any(
        other != key and not other.startswith("model.") and value == flat[key]
        for other, value in flat.items()
        if other == name.replace("_", ".") or other.rsplit(".", 1)[-1] == name
    )


def _applies(key: str, config: dict) -> bool:
    if is_capability(key) or key.startswith("tracking."):
        return False
    data, model = config.get("data") or {}, config.get("model") or {}
    if key == "data.image_size":
        return "image_size" in model  # vision models read it
    if key == "data.path":
        return data.get("name") != "random"
    if key == "data.dataset":
        return data.get("name") == "hdf5"
    return True


NAME_GROUPS = ("backend", "model", "task", "mode", "device", "dtype")
SWEEP_SYNTAX = (",", "range(", "choice(", "interval(", "glob(")


def run_name(config: dict, swept: dict[str, str] | None = None, job: str | None = None) -> str:
    """'numpy-mlp-gradients-eager-cpu-float32', then the job's value of every swept key the groups do
    not already name ('size=1000') and a sweep job's number ('#3'): unique within a sweep, and apart
    from single runs."""
    name = "-".join(str(_choice(config, key)) for key in NAME_GROUPS)
    extra = [f"{_short(k)}={v}" for k, v in (swept or {}).items() if k not in NAME_GROUPS]
    return " ".join([name, *extra, *([f"#{job}"] if job is not None else [])])


def _short(key: str) -> str:
    return key.removeprefix("model.") if key in ("model.size", "model.n", "model.arch", "model.method") else key


def swept_keys(overrides: list[str], sweeper_params: dict | None = None) -> dict[str, str]:
    """What a sweep varies, key -> values: command-line overrides with sweep syntax, then the sweeper's
    own params (an experiment file's hydra.sweeper.params) that the command line did not replace."""
    swept = dict(_split_override(o) for o in overrides)
    swept = {k: v for k, v in swept.items() if any(t in v for t in SWEEP_SYNTAX)}
    for key, values in (sweeper_params or {}).items():
        key = key.lstrip("+~")
        if key not in swept and any(t in str(values) for t in SWEEP_SYNTAX):
            swept[key] = str(values)
    return swept


def sweep_title(note: dict) -> str:
    """'sweep backend=numpy,torch × mode=eager,function': a parent run named by what it sweeps."""
    swept = swept_keys(note.get("overrides", []), note.get("sweeper_params"))
    return "sweep " + (" × ".join(f"{k}={v}" for k, v in swept.items()) or Path(note["sweep_dir"]).name)


def job_context(run_dir: Path) -> tuple[dict[str, str], str | None]:
    """For a sweep's job: its value of each swept key (from its .hydra/overrides.yaml) and its number."""
    note_path, overrides_path = run_dir.parent / "sweep.json", run_dir / ".hydra" / "overrides.yaml"
    if not note_path.exists() or not overrides_path.exists():
        return {}, None
    from omegaconf import OmegaConf

    note = json.loads(note_path.read_text())
    job_values = dict(_split_override(str(o)) for o in OmegaConf.load(overrides_path))
    swept = swept_keys(note.get("overrides", []), note.get("sweeper_params"))
    return {k: job_values.get(k, "?") for k in swept}, run_dir.name


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

        for name in ("alembic", "mlflow.store.db.utils"):  # creating the tables is not the user's news
            logging.getLogger(name).setLevel(logging.WARNING)
        check_store_path(uri)
        path = sqlite_path(uri)
        if path is not None:
            path.parent.mkdir(exist_ok=True)
        with store_lock(uri):  # creating the tables is not safe from two processes at once
            if path is not None and not path.exists():
                _create_store(uri, path)
            _open_client(uri)
        if first_time:  # later jobs of a sweep freeze nothing more: their garbage stays collectable
            gc.freeze()
    finally:
        if collecting:
            gc.enable()


def _create_store(uri: str, path: Path) -> None:
    """A new SQLite store, created so that a kill at any moment leaves no store or a complete one: MLflow
    creates and migrates its tables in a file beside it (seconds, while other work runs), which is then
    renamed into place. Called under store_lock, so a leftover of an earlier, killed creation is stale."""
    for stale in path.parent.glob(f".{path.name}.*.creating*"):  # with SQLite's -journal beside it
        stale.unlink()
    creating = path.with_name(f".{path.name}.{os.getpid()}.creating")
    _, mark, query = uri.partition("?")
    _open_client(f"sqlite:///{creating}{mark}{query}")
    os.replace(creating, path)


def _open_client(uri: str) -> None:
    """Open the store at `uri` (a database store creates or migrates its tables; a server is not contacted);
    a store that a killed process left half-migrated is one ConfigError line saying what to do."""
    try:
        retry_on_lock(client, uri)
    except Exception as error:
        if "_alembic_tmp_" not in str(error):
            raise
        raise ConfigError(
            f"tracking.uri={uri}: the store was left half-migrated (a process was killed while MLflow created or "
            "upgraded its tables); move the file aside (or restore it from a backup) and a new store is created"
        ) from None


def sqlite_path(uri: str) -> Path | None:
    """The database file of a local SQLite store (None for a server or an in-memory database)."""
    if not uri.startswith("sqlite:///") or uri.startswith("sqlite:///:memory:"):
        return None
    return Path(uri.removeprefix("sqlite:///").split("?", 1)[0])


def check_store_path(uri: str) -> None:
    """A local store must be creatable or writable where it is: checked before MLflow, which would retry for
    minutes (or create folders) first."""
    path = sqlite_path(uri)
    if path is None:
        return
    if path.exists():
        if not path.is_file() or not os.access(path, os.R_OK | os.W_OK):
            raise ConfigError(f"tracking.uri={uri}: {path} is not a database file this user can write")
        return
    folder = path.parent.absolute()
    # The store's own folder may be new (outputs/ in a fresh clone), made by open_store; nothing above it.
    existing = folder if folder.is_dir() else folder.parent
    if not existing.is_dir() or (existing != folder and existing == Path(existing.anchor)):
        raise ConfigError(f"tracking.uri={uri}: the folder {folder} does not exist")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise ConfigError(f"tracking.uri={uri}: cannot create a database in {folder} (not writable)")


@contextlib.contextmanager
def store_lock(uri: str) -> Iterator[None]:
    """Hold an exclusive flock on `DB.lock` beside a local SQLite store (nothing for a server)."""
    path = sqlite_path(uri)
    if path is None:
        yield
        return
    with open(path.with_name(path.name + ".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def client(uri: str):
    """An MlflowClient for `uri` (MLflow caches the store behind it)."""
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=uri)


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
    note = read_note(run_dir)
    tags[RUN_KEY_TAG] = note.get("run_key") or run_key(run_dir)
    _remove_partial_uploads(mlflow, experiment_id, tags[RUN_KEY_TAG], note.get("run_id"))
    run = retry_on_lock(mlflow.create_run, experiment_id, start_time=started_ms, tags=tags)
    run_id = run.info.run_id
    write_note(run_dir, {**note, "uri": uri, "experiment": experiment, "run_id": run_id, "synced": False})
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
        mlflow.set_terminated(run_id, "FAILED")


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
    """Params, metrics (with the time_sample_s history), the dataset input and the files of a run."""
    from mlflow.entities import Param

    params = [Param(k, v[:6000]) for k, v in run_params(result.config).items()]
    metrics = _metrics(result, read_samples(run_dir), read_timings(run_dir, "sample_end_unix_s"), ended_ms)
    for chunk in range(0, max(len(metrics), 1), 1000):  # log_batch takes at most 1000 metrics
        batch = {"params": params} if chunk == 0 else {}
        retry_on_lock(mlflow.log_batch, run_id, metrics=metrics[chunk : chunk + 1000], **batch)
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
        "mlflow.user": env.get("user") or _user(),
        "mlflow.note.content": note_content(result),
        "run_dir": str(run_dir.resolve()),
        **{f"env.{k}": str(v)[:5000] for k, v in env.items() if not _duplicate(k, env)},
    }
    tags.update(git_tags(env))
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
    """MLflow's source tags (commit, branch, dirty) from a run's git_* facts (runner.environment.git_source)."""
    return {tag: str(source[key]) for key, tag in GIT_TAGS.items() if source.get(key, "unknown") != "unknown"}


def _duplicate(key: str, env: dict) -> bool:
    """git_* are MLflow's mlflow.source.git.* tags; a CPU run's device_name repeats env.cpu."""
    return key in GIT_TAGS or (key == "device_name" and env.get("device_name") == env.get("cpu"))


def _user() -> str:
    import getpass

    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return "unknown"


def note_content(result: Result) -> str:
    """The run's description in the UI: what ran, how fast (median ± IQR), how accurate, on what."""
    from runner.table import format_seconds

    m, c = result.metrics, result.config
    lines = [f"**{run_name(c)}**, batch {c.get('batch_size')}, seed {c.get('seed')}: {result.status}"]
    if "time_median_s" in m:
        lines.append(
            f"median {format_seconds(m['time_median_s'])} ± {format_seconds(m['time_iqr_s'])} (IQR) per call "
            f"over {m.get('n_samples', '?')} samples; first call {format_seconds(m['first_call_s'])}"
        )
    if "throughput_per_s" in m:
        lines.append(f"{m['throughput_per_s']:.3g} examples/s")
    if "max_rel_err_vs_reference" in m:
        lines.append(f"max rel err vs the float64 reference {m['max_rel_err_vs_reference']:.2g}")
    lines += [f"warning: {w}" for w in result.warnings]
    if result.error:
        lines.append(f"error: {result.error}")
    env = result.environment
    if env:
        framework = f"{env.get('framework', '')} {env.get('framework_version', '')}".strip()
        lines.append(f"on {env.get('device_name', '?')} ({framework})")
    return "  \n".join(lines)[:5000]


def _metrics(result: Result, samples, sample_ends, ended_ms: int) -> list:
    """The metrics at the job's end, and every timing sample as steps of `time_sample_s` (the UI plots it),
    each stamped with the moment it ended (the job's end where a run did not record that)."""
    from mlflow.entities import Metric

    metrics = [Metric(k, float(v), ended_ms, 0) for k, v in result.metrics.items() if isinstance(v, int | float)]
    if samples is None:
        return metrics
    if sample_ends is None or len(sample_ends) != len(samples):
        sample_ends = [ended_ms / 1000] * len(samples)
    stamped = zip(samples, sample_ends, strict=True)
    return metrics + [Metric("time_sample_s", float(v), _ms(end), step) for step, (v, end) in enumerate(stamped)]


def dataset_input(run_dir: Path, result: Result):
    """The run's inputs as an MLflow dataset: its file (or the seed that made it), digest and shape."""
    from mlflow.data import from_numpy
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
    note = retry_on_lock(mlflow.get_run, run_id).data.tags.get("mlflow.note.content", "")
    retry_on_lock(mlflow.set_tag, run_id, "mlflow.note.content", f"{note}  \n{line}"[:5000])


def log_comparison(uri: str, run_id: str, metrics: dict[str, float], line: str) -> None:
    """A sweep's comparison of one of its jobs: metrics (NaN ones left out) and a line in its description."""
    import math

    mlflow = client(uri)
    for key, value in metrics.items():
        if not math.isnan(value):
            retry_on_lock(mlflow.log_metric, run_id, key, value)
    append_to_note(uri, run_id, line)


def _log_run_files(mlflow, run_id: str, run_dir: Path) -> None:
    for name in (RESULT_FILE, TENSORS_FILE, "job.log", "error.log"):
        if (run_dir / name).exists():
            retry_on_lock(mlflow.log_artifact, run_id, str(run_dir / name))
    for folder, artifact_path in ((".hydra", "hydra"), ("images", "images")):
        if (run_dir / folder).is_dir():
            retry_on_lock(mlflow.log_artifacts, run_id, str(run_dir / folder), artifact_path)


# MLflow 3's UI opens an experiment on its GenAI overview unless this tag calls it a model-training one.
EXPERIMENT_TAGS = {"mlflow.experimentKind": "custom_model_development"}


def ensure_experiment(mlflow, uri: str, name: str) -> str:
    """The experiment's id, creating it (artifacts beside a local SQLite store) if it is new."""
    from mlflow.exceptions import MlflowException

    with store_lock(uri):  # two processes must not both find it missing and both create it
        existing = retry_on_lock(mlflow.get_experiment_by_name, name)
        if existing is not None:
            return existing.experiment_id
        try:
            location = _artifact_location(uri, name)
            return retry_on_lock(mlflow.create_experiment, name, artifact_location=location, tags=EXPERIMENT_TAGS)
        except MlflowException as error:  # created meanwhile by a process of another machine
            existing = retry_on_lock(mlflow.get_experiment_by_name, name)
            if existing is None:
                raise ConfigError(f"MLflow cannot create the experiment {name!r} ({first_line(error)})") from None
            return existing.experiment_id


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


def run_key(run_dir: Path) -> str:
    """A stable key for one run of one directory: its absolute path and the time it started."""
    text = f"{Path(run_dir).resolve()}@{time.time_ns()}"
    return hashlib.sha1(text.encode(), usedforsecurity=False).hexdigest()


def read_note(run_dir: Path) -> dict:
    path = Path(run_dir) / TRACKING_FILE
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except ValueError:
        raise ConfigError(f"{path} cannot be read (not JSON): upload with runner sync --tracking-uri URI") from None


def write_note(run_dir: Path, note: dict) -> None:
    """tracking.json, whole or not at all."""
    path = Path(run_dir) / TRACKING_FILE
    temporary = path.with_name(f".{TRACKING_FILE}.{os.getpid()}.tmp")
    temporary.write_text(json.dumps(note, indent=2) + "\n")
    os.replace(temporary, path)


def write_pending(run_dir: Path, uri: str, experiment: str, parent_run_id: str | None) -> None:
    """Before the job starts: where it is to be logged, so that `runner sync` can upload it whatever happens."""
    note = {"uri": uri, "experiment": experiment, "parent_run_id": parent_run_id, "run_key": run_key(run_dir)}
    write_note(run_dir, {**note, "run_id": None, "synced": False})


def track(run_dir: Path, uri: str, experiment: str, parent_run_id: str | None = None) -> str | None:
    """Log run_dir to MLflow; on failure keep everything local, say so, and leave a note for sync."""
    note = {"uri": uri, "experiment": experiment, "parent_run_id": parent_run_id}
    try:
        check_reachable(uri)
        run_id = log_to_mlflow(run_dir, uri, experiment, parent_run_id)
    except Exception as error:  # the store is down, locked or unreachable: results stay on disk
        reason = first_line(error)
        write_note(run_dir, {**_safe_note(run_dir), **note, "synced": False, "error": reason})
        print(
            f"warning: could not log to MLflow at {uri} ({reason}); results are kept in {run_dir} "
            f"-- upload them later with: runner sync {run_dir}",
            file=sys.stderr,
        )
        return None
    write_note(run_dir, {**read_note(run_dir), **note, "run_id": run_id, "synced": True})
    return run_id


def _safe_note(run_dir: Path) -> dict:
    try:
        return read_note(run_dir)
    except ConfigError:
        return {}


def check_reachable(uri: str, timeout_s: float = 5.0) -> None:
    """Fail fast when a tracking server does not answer or a local store cannot be written: MLflow's own
    retries would wait minutes."""
    check_store_path(uri)
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
    """Upload a run that could not reach its store when it ran (or whose processes were killed); returns
    the new run id, None when it is in MLflow already."""
    run_dir = Path(run_dir)
    note = read_note(run_dir)
    if not note:
        raise FileNotFoundError(f"{run_dir} has no {TRACKING_FILE}: it was not a tracked run")
    if note.get("synced"):
        return None
    if not Result.exists(run_dir):  # the worker and its launcher died before recording anything
        Result(status="KILLED", error=NO_RESULT).save(run_dir)
    uri = uri or note["uri"]
    check_reachable(uri)
    run_id = log_to_mlflow(run_dir, uri, note["experiment"], note.get("parent_run_id"))
    write_note(run_dir, {**read_note(run_dir), "run_id": run_id, "synced": True, "error": None, "uri": uri})
    return run_id


# -- sweeps: a parent run, and reports over runs ------------------------------------------------


def create_parent_run(note: dict) -> str:
    """The parent run of a sweep (`note` is its sweep.json), named by what it sweeps; its params are the
    sweep's overrides."""
    check_reachable(note["uri"])
    open_store(note["uri"])
    from mlflow.entities import Param

    mlflow = client(note["uri"])
    experiment_id = ensure_experiment(mlflow, note["uri"], note["experiment"])
    title = sweep_title(note)
    overrides = " ".join(note["overrides"])
    tags = {
        "mlflow.runName": title[:250],
        "mlflow.source.type": "LOCAL",
        "mlflow.source.name": "run.py",
        "mlflow.user": _user(),
        "mlflow.note.content": f"{title}  \nin {note['sweep_dir']}  \n`python run.py -m {overrides}`"[:5000],
        "sweep_dir": note["sweep_dir"],
        "launcher": note["launcher"],
        "overrides": overrides[:5000],
    }
    from runner.environment import git_source

    tags.update(git_tags(git_source()))
    run = retry_on_lock(mlflow.create_run, experiment_id, tags=tags)
    params = [Param(k, v) for k, v in dict(_split_override(o) for o in note["overrides"]).items()]  # last wins
    if params:
        retry_on_lock(mlflow.log_batch, run.info.run_id, params=params)
    return run.info.run_id


def _split_override(override: str) -> tuple[str, str]:
    key, _, value = override.partition("=")
    return key.lstrip("+~"), value[:6000]


def close_parent_run(
    uri: str, run_id: str, counts: dict[str, int], files: list[Path], status: str, description: str = ""
) -> None:
    """Log a sweep's job counts and summary files to its parent run, add `description` (the sweep's table,
    markdown) to what the UI shows of it, and end it with `status`."""
    from mlflow.entities import Metric

    mlflow = client(uri)
    now = int(time.time() * 1000)
    try:
        retry_on_lock(mlflow.log_batch, run_id, metrics=[Metric(k, float(v), now, 0) for k, v in counts.items()])
        if description:
            note = retry_on_lock(mlflow.get_run, run_id).data.tags.get("mlflow.note.content", "")
            retry_on_lock(mlflow.set_tag, run_id, "mlflow.note.content", fit_note(f"{note}\n\n{description}"))
        log_files(uri, run_id, [p for p in files if p.parent.name != "report"])
        log_files(uri, run_id, [p for p in files if p.parent.name == "report"], "report")
    finally:  # ended whatever could not be logged: never left RUNNING (sync logs the files again)
        retry_on_lock(mlflow.set_terminated, run_id, status)


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


def _recorded_environment(tags: dict[str, str]) -> dict[str, str]:
    """A run's environment as its tags hold it: env.* and the git facts under MLflow's own tags."""
    environment = {k.removeprefix("env."): v for k, v in tags.items() if k.startswith("env.")}
    return environment | {key: tags[tag] for key, tag in GIT_TAGS.items() if tag in tags}


def search_runs(uri: str, experiment: str, parent_run_id: str | None = None) -> list[dict]:
    """The measurement runs of an experiment (only the children of parent_run_id when given), oldest
    first, as {"run", "run_id", "run_dir", "status", "error", "parent_run_id", "params.*", "metrics.*",
    "env.*" (runner.setups)}."""
    mlflow = client(uri)
    found = mlflow.get_experiment_by_name(experiment)
    if found is None:
        raise LookupError(f"no experiment named {experiment!r} at {uri}")
    return _measurement_rows(mlflow, found.experiment_id, parent_run_id)


def runs_of(uri: str, run_id: str) -> list[dict]:
    """One run as search_runs gives it, or a sweep's jobs where run_id is the sweep's parent run."""
    mlflow = client(uri)
    try:
        run = mlflow.get_run(run_id)
    except Exception as error:
        raise LookupError(f"no run {run_id} at {uri} ({first_line(error)})") from None
    if "sweep_dir" in run.data.tags:
        return _measurement_rows(mlflow, run.info.experiment_id, run_id)
    return [_run_row(run)]


def download_tensors(uri: str, run_id: str, directory: Path) -> str | None:
    """Fetch a run's tensors.h5 artifact into `directory` (returned), or None where it has none."""
    import mlflow.artifacts

    directory.mkdir(parents=True, exist_ok=True)
    try:
        mlflow.artifacts.download_artifacts(
            run_id=run_id, artifact_path=TENSORS_FILE, dst_path=str(directory), tracking_uri=uri
        )
    except Exception:  # noqa: BLE001 - a run logged without its files: compared by its medians alone
        return None
    return str(directory)


def _measurement_rows(mlflow, experiment_id: str, parent_run_id: str | None) -> list[dict]:
    query = f"tags.mlflow.parentRunId = '{parent_run_id}'" if parent_run_id else ""
    runs = mlflow.search_runs([experiment_id], filter_string=query, max_results=50_000)
    # a sweep's parent run is not a measurement
    return [_run_row(r) for r in sorted(runs, key=lambda r: r.info.start_time) if "sweep_dir" not in r.data.tags]


def _run_row(run) -> dict:
    from runner.setups import environment_columns

    tags = run.data.tags
    row = {
        "run": run.info.run_name or run.info.run_id[:8],
        "run_id": run.info.run_id,
        "run_dir": tags.get("run_dir"),
        "status": run.info.status,
        "error": tags.get("error"),
        "parent_run_id": tags.get("mlflow.parentRunId"),
    }
    row.update({f"params.{k}": v for k, v in run.data.params.items()})
    row.update({f"metrics.{k}": v for k, v in run.data.metrics.items()})
    row.update(environment_columns(_recorded_environment(tags)))
    return row

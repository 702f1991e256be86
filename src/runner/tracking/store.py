"""Opening an MLflow store: a new SQLite store created whole or not at all, under a lock; its client;
retries while SQLite is locked; a server that does not answer found in seconds; experiments."""

from __future__ import annotations

import contextlib
import fcntl
import gc
import logging
import os
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from runner.config import ConfigError, first_line

# A tracking server that is down should cost seconds, not MLflow's default minutes of retries.
os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "2")
os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "20")
# A fresh SQLite store announces its migrations at INFO: start-up noise, not news for the user.
for _logger in ("mlflow.store.db.utils", "alembic"):
    logging.getLogger(_logger).setLevel(logging.WARNING)


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


UI_PORT = 5000  # `mlflow ui`'s own default, given in the command so that the command and the link agree
MODEL_TRAINING = "workflowType=machine_learning"  # MLflow 3's UI opens a run on its GenAI view otherwise


def ui_base(uri: str) -> str:
    """Where a person opens the store at `uri` in the MLflow UI: the server itself, or `mlflow ui` on this machine."""
    return uri.rstrip("/") if uri.startswith(("http://", "https://")) else f"http://127.0.0.1:{UI_PORT}"


def client(uri: str):
    """An MlflowClient for `uri` (MLflow caches the store behind it). A server gone mid-sweep is said in one line of
    the runner's (the failed call's first line): urllib3's warning at each of MLflow's retries is not printed."""
    from mlflow.tracking import MlflowClient

    logging.getLogger("urllib3.connectionpool").setLevel(logging.ERROR)

    return MlflowClient(tracking_uri=uri)


# The runs list's columns without setup: MLflow's shared view state (an experiment tag the UI reads for
# `?viewStateShareKey=RUNS_VIEW`): a sweep's verdict, the host, one ratio column across sweeps (pooled.ranked_metrics),
# each job's typical time (what its ratio compares: one statistic on the page) and ratio, then the tasks' own
# metrics (runner.tasks.builtin_metrics: a generation's first token, per token, tokens/s). A column key is the UI's:
# `metrics.`NAME``.
RUNS_VIEW = "tensor-runner"
RUNS_VIEW_COLUMNS = (
    "tags.`verdict`",
    "tags.`env.hostname`",  # where each ran: a team's machines and a cluster's nodes pool in one experiment
    "metrics.`next_fastest.time_ratio`",
    "metrics.`fastest.time_typical_us`",
    "metrics.`time_typical_us`",
    "metrics.`time_ratio`",
)


def runs_view_columns() -> list[str]:
    from runner.tasks import builtin_metrics
    from runner.tracking.run_page import ui_metric

    shown = [ui_metric(m.key, 1.0) for m in builtin_metrics()]
    return [*RUNS_VIEW_COLUMNS, *(f"metrics.`{said[0]}`" for said in shown if said is not None)]


def runs_view_tag() -> tuple[str, str]:
    import json

    return f"mlflow.sharedViewState.{RUNS_VIEW}", json.dumps({"selectedColumns": runs_view_columns()})


# MLflow 3's UI opens an experiment on its GenAI overview unless this tag calls it a model-training one.
EXPERIMENT_TAGS = {"mlflow.experimentKind": "custom_model_development", runs_view_tag()[0]: runs_view_tag()[1]}


def experiment_of(uri: str, run_id: str) -> str | None:
    """The id of the experiment a run is in (None where the store does not say): what the UI's links name."""
    try:
        return retry_on_lock(client(uri).get_run, run_id).info.experiment_id
    except Exception:  # the link without its experiment still opens the run
        return None


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
    """Call an MLflow client method, retrying while another process holds what it needs (_held_by_another)."""
    for attempt in range(attempts):
        try:
            return call(*args, **kwargs)
        except Exception as error:
            if not _held_by_another(error) or attempt == attempts - 1:
                raise
            time.sleep(0.2 * 2**attempt)
    raise AssertionError("unreachable")


def _held_by_another(error: Exception) -> bool:
    """A shared SQLite store locked by another process, or a race on a dataset: runs logging the same inputs
    at once each look the dataset up, miss it, and insert it, and all but one insert fail on its unique key
    (rolled back whole). The next attempt finds the dataset and links it."""
    text = str(error)
    lost_dataset_race = "datasets" in text and ("UNIQUE constraint failed" in text or "duplicate key" in text)
    return "locked" in text.lower() or lost_dataset_race


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

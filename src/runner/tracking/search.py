"""Reading runs back for reports and comparisons: an experiment's runs, a run or a sweep's jobs, samples."""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from runner.config import first_line
from runner.record.result import TENSORS_FILE, Status
from runner.record.runs import Run, identity_from_record
from runner.tracking.run_page import stored_metric
from runner.tracking.store import client
from runner.tracking.upload import GIT_TAGS


def _recorded_environment(tags: dict[str, str]) -> dict[str, str]:
    """A run's environment as its tags hold it: env.* and the git facts under MLflow's own tags."""
    environment = {k.removeprefix("env."): v for k, v in tags.items() if k.startswith("env.")}
    return environment | {key: tags[tag] for key, tag in GIT_TAGS.items() if tag in tags}


def search_runs(uri: str, experiment: str, parent_run_id: str | None = None) -> list[Run]:
    """The measurement runs of an experiment (only the children of parent_run_id when given), oldest first."""
    mlflow = _reader(uri)
    with _reading(uri):
        found = mlflow.get_experiment_by_name(experiment)
        if found is None:
            raise LookupError(f"no experiment named {experiment!r} at {uri}")
        return _measurement_rows(mlflow, found.experiment_id, parent_run_id)


def runs_of(uri: str, run_id: str) -> list[Run]:
    """One run as search_runs gives it, or a sweep's jobs where run_id is the sweep's parent run."""
    mlflow = _reader(uri)
    try:
        run = mlflow.get_run(run_id)
    except Exception as error:
        raise LookupError(f"no run {run_id} at {uri} ({first_line(error)})") from None
    with _reading(uri):
        if "sweep_dir" in run.data.tags:
            return _measurement_rows(mlflow, run.info.experiment_id, run_id)
        return [_run(run)]


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


def _measurement_rows(mlflow, experiment_id: str, parent_run_id: str | None) -> list[Run]:
    query = f"tags.mlflow.parentRunId = '{parent_run_id}'" if parent_run_id else ""
    runs = mlflow.search_runs([experiment_id], filter_string=query, max_results=50_000)
    # a sweep's parent run is not a measurement
    return [_run(r) for r in sorted(runs, key=lambda r: r.info.start_time) if "sweep_dir" not in r.data.tags]


def _run(run) -> Run:
    """An MLflow run as a Run: its identity from its tags (computed for a run recorded before them)."""
    tags = dict(run.data.tags)
    metrics = dict(stored_metric(*item) for item in run.data.metrics.items())
    if "machine_cpus" in metrics:  # measured, and no steal to log (run_page.ZERO_SAYS_NOTHING)
        metrics.setdefault("machine_steal_pct", 0.0)
    name = run.info.run_name or run.info.run_id[:8]
    params, environment = dict(run.data.params), _recorded_environment(tags)
    return Run(
        name=name,
        status=run.info.status,
        identity=identity_from_record(params, tags, environment, name) if environment else None,
        params=params,
        metrics=metrics,
        environment=environment,
        run_dir=tags.get("run_dir"),
        run_id=run.info.run_id,
        started=(run.info.start_time or 0) / 1000,
        error=tags.get("error"),
        tags=tags,
        experiment_id=run.info.experiment_id,
    )


def history_runs(
    uri: str, experiment: str | None, case: str | None = None, machine: str | None = None, status: str = "FINISHED"
) -> list[Run]:
    """The runs of `status` (FINISHED, or FAILED) that carry a case (runner.identity), of one experiment or of all,
    only those of `case` and `machine` where given: MLflow filters on the tags (an index lookup, not a scan)."""
    from mlflow.entities import ViewType

    query = [
        f"attributes.status = '{Status(status)}'",
        f"tags.`case` = '{_key(case, '--case')}'" if case else "tags.`case` LIKE '%'",
    ]
    if machine:
        query.append(f"tags.`machine` = '{_key(machine, '--machine')}'")
    mlflow = _reader(uri)
    with _reading(uri):
        if experiment:
            found = mlflow.get_experiment_by_name(experiment)
            if found is None:
                raise LookupError(f"no experiment named {experiment!r} at {uri}")
            experiments = [found.experiment_id]
        else:
            experiments = [e.experiment_id for e in mlflow.search_experiments(view_type=ViewType.ACTIVE_ONLY)]
        runs, token = [], None
        while True:  # MLflow pages search results
            page = mlflow.search_runs(experiments, " and ".join(query), max_results=10_000, page_token=token)
            runs += page
            token = page.token
            if not token:
                break
        return [_run(run) for run in runs]


def _key(value: str, option: str) -> str:
    """A case or machine key as a filter's value: 16 hex digits (runner.identity), never text spliced in."""
    if not re.fullmatch(r"[0-9a-f]{16}", value):
        raise LookupError(f"{option} {value}: a key is 16 hex digits, as a run's tag of that name holds it")
    return value


READ_SCHEMES = ("sqlite", "postgresql", "mysql", "mssql", "http", "https", "databricks")
SQLITE_HEADER = b"SQLite format 3\x00"  # the first 16 bytes of every SQLite database file


def _reader(uri: str):
    """A client for a store that a command only reads: the URI names one MLflow reads, a local store exists and is
    an SQLite database (reading never creates one, folders and all), a server answers; LookupError (one line)
    otherwise."""
    from runner.tracking.store import check_reachable, sqlite_path

    scheme = uri.split("://", 1)[0].split("+", 1)[0] if "://" in uri else ""
    if scheme not in READ_SCHEMES:
        raise LookupError(
            f"tracking URI {uri}: not a store MLflow reads; give sqlite:///PATH/mlflow.db, http://HOST:PORT or a "
            f"database URL ({', '.join(READ_SCHEMES)})"
        )
    path = sqlite_path(uri)
    if path is not None and not path.is_file():
        raise LookupError(f"no MLflow store at {path} (tracking URI {uri})")
    if path is not None and path.open("rb").read(len(SQLITE_HEADER)) != SQLITE_HEADER:
        raise LookupError(f"{path} is not an SQLite database, so no MLflow store (tracking URI {uri})")
    check_reachable(uri)  # a server that does not answer: ConnectionError, one line
    return client(uri)


@contextmanager
def _reading(uri: str) -> Iterator[None]:
    """What MLflow, its database driver or its HTTP client raise while a store is read, as one line."""
    try:
        yield
    except Exception as error:
        if type(error).__module__.split(".")[0] not in ("mlflow", "sqlalchemy", "requests", "urllib3"):
            raise
        raise LookupError(f"the MLflow store at {uri} could not be read: {first_line(error)}") from None


def existing_run(uri: str, run_id: str):
    """A client for a store that exists and holds the run `run_id`; LookupError (one line) otherwise."""
    mlflow = _reader(uri)
    try:
        mlflow.get_run(run_id)
    except Exception as error:
        raise LookupError(f"no run {run_id} at {uri} ({first_line(error)})") from None
    return mlflow


def set_tags(uri: str, run_id: str, tags: dict[str, str]) -> None:
    """Tag a run that exists (a known change's mark, a history's verdict on its newest run)."""
    from runner.tracking.store import retry_on_lock

    mlflow = existing_run(uri, run_id)
    with _reading(uri):
        for key, value in tags.items():
            retry_on_lock(mlflow.set_tag, run_id, key, value[:5000])

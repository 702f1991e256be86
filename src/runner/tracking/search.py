"""Reading runs back for reports and comparisons: an experiment's runs, a run or a sweep's jobs, samples."""

from __future__ import annotations

from pathlib import Path

from runner.config import first_line
from runner.record.result import TENSORS_FILE
from runner.tracking.run_page import stored_metric
from runner.tracking.store import client
from runner.tracking.upload import GIT_TAGS


def _recorded_environment(tags: dict[str, str]) -> dict[str, str]:
    """A run's environment as its tags hold it: env.* and the git facts under MLflow's own tags."""
    environment = {k.removeprefix("env."): v for k, v in tags.items() if k.startswith("env.")}
    return environment | {key: tags[tag] for key, tag in GIT_TAGS.items() if tag in tags}


def search_runs(uri: str, experiment: str, parent_run_id: str | None = None) -> list[dict]:
    """The measurement runs of an experiment (only the children of parent_run_id when given), oldest
    first, as {"run", "run_id", "run_dir", "status", "error", "parent_run_id", "params.*", "metrics.*",
    "env.*" (runner.record.setups)}."""
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
    from runner.record.setups import environment_columns

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
    row.update({f"metrics.{k}": v for k, v in (stored_metric(*item) for item in run.data.metrics.items())})
    if "metrics.machine_cpus" in row:  # measured, and no steal to log (run_page.ZERO_SAYS_NOTHING)
        row.setdefault("metrics.machine_steal_pct", 0.0)
    row.update(environment_columns(_recorded_environment(tags)))
    return row


def history_rows(uri: str, experiment: str | None, case: str | None = None, machine: str | None = None) -> list[dict]:
    """The finished runs that carry a case (runner.record.naming.case), of one experiment or of all, only those of
    `case` and `machine` where given: MLflow filters on the tags (an index lookup, not a scan of the store). Each as
    {"run_id", "start_time" (ms), "status", "tags.*", "metrics.*" (seconds), "env.*"}."""
    from mlflow.entities import ViewType

    _must_exist(uri)
    mlflow = client(uri)
    if experiment:
        found = mlflow.get_experiment_by_name(experiment)
        if found is None:
            raise LookupError(f"no experiment named {experiment!r} at {uri}")
        experiments = [found.experiment_id]
    else:
        experiments = [e.experiment_id for e in mlflow.search_experiments(view_type=ViewType.ACTIVE_ONLY)]
    query = ["attributes.status = 'FINISHED'", f"tags.`case` = '{case}'" if case else "tags.`case` LIKE '%'"]
    if machine:
        query.append(f"tags.`machine` = '{machine}'")
    runs, token = [], None
    while True:  # MLflow pages search results
        page = mlflow.search_runs(experiments, " and ".join(query), max_results=10_000, page_token=token)
        runs += page
        token = page.token
        if not token:
            break
    return [_history_row(run) for run in runs]


def _must_exist(uri: str) -> None:
    """A command that reads a local store finds it (MLflow would create an empty one, folders and all)."""
    from runner.tracking.store import sqlite_path

    path = sqlite_path(uri)
    if path is not None and not path.is_file():
        raise LookupError(f"no MLflow store at {path} (tracking URI {uri})")


def set_tags(uri: str, run_id: str, tags: dict[str, str]) -> None:
    """Tag a run that exists (a known change's mark, a history's verdict on its newest run)."""
    from runner.tracking.store import retry_on_lock

    _must_exist(uri)
    mlflow = client(uri)
    try:
        mlflow.get_run(run_id)
    except Exception as error:
        raise LookupError(f"no run {run_id} at {uri} ({first_line(error)})") from None
    for key, value in tags.items():
        retry_on_lock(mlflow.set_tag, run_id, key, value[:5000])


def _history_row(run) -> dict:
    row = {"run_id": run.info.run_id, "start_time": run.info.start_time, "status": run.info.status}
    row.update({f"tags.{k}": v for k, v in run.data.tags.items()})
    row.update({f"metrics.{k}": v for k, v in (stored_metric(*item) for item in run.data.metrics.items())})
    row.update({f"env.{k}": v for k, v in _recorded_environment(run.data.tags).items()})
    return row

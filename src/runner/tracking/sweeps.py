"""A sweep's parent run: created before its jobs, closed with their counts, files and table."""

from __future__ import annotations

import time
from pathlib import Path

from runner.record.naming import split_override, sweep_title
from runner.tracking.store import check_reachable, client, ensure_experiment, open_store, retry_on_lock
from runner.tracking.upload import fit_note, git_tags, log_files, user_name


def create_parent_run(info: dict) -> str:
    """The parent run of a sweep (`info` is its sweep.json), named by what it sweeps; its params are the
    sweep's overrides."""
    check_reachable(info["uri"])
    open_store(info["uri"])
    from mlflow.entities import Param

    mlflow = client(info["uri"])
    experiment_id = ensure_experiment(mlflow, info["uri"], info["experiment"])
    title = sweep_title(info)
    overrides = " ".join(info["overrides"])
    tags = {
        "mlflow.runName": title[:250],
        "mlflow.source.type": "LOCAL",
        "mlflow.source.name": "run.py",
        "mlflow.user": user_name(),
        "mlflow.note.content": f"{title}  \nin {info['sweep_dir']}  \n`python run.py -m {overrides}`"[:5000],
        "sweep_dir": info["sweep_dir"],
        "launcher": info["launcher"],
        "overrides": overrides[:5000],
    }
    from runner.record.environment import git_source

    tags.update(git_tags(git_source()))
    run = retry_on_lock(mlflow.create_run, experiment_id, tags=tags)
    params = [Param(k, v) for k, v in dict(split_override(o) for o in info["overrides"]).items()]  # last wins
    if params:
        retry_on_lock(mlflow.log_batch, run.info.run_id, params=params)
    return run.info.run_id


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
            opening = retry_on_lock(mlflow.get_run, run_id).data.tags.get("mlflow.note.content", "")
            retry_on_lock(mlflow.set_tag, run_id, "mlflow.note.content", fit_note(f"{opening}\n\n{description}"))
        log_files(uri, run_id, [p for p in files if p.parent.name != "report"])
        log_files(uri, run_id, [p for p in files if p.parent.name == "report"], "report")
    finally:  # ended whatever could not be logged: never left RUNNING (sync logs the files again)
        retry_on_lock(mlflow.set_terminated, run_id, status)

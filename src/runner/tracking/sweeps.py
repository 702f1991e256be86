"""A sweep's parent run: created before its jobs, closed with their counts, files and table."""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from urllib.parse import quote

from runner.locations import CONFIG_DIR
from runner.record.naming import split_override, sweep_title
from runner.tracking.store import (
    check_reachable,
    client,
    ensure_experiment,
    open_store,
    retry_on_lock,
    runs_view_tag,
)
from runner.tracking.upload import fit_note, git_tags, log_files, user_name


def create_parent_run(info: dict) -> str:
    """The parent run of a sweep (`info` is its sweep.json), named by what it sweeps; its params are the
    sweep's overrides."""
    check_reachable(info["uri"])
    open_store(info["uri"])
    from mlflow.entities import Param

    mlflow = client(info["uri"])
    experiment_id = ensure_experiment(mlflow, info["uri"], info["experiment"])
    tags = {
        "mlflow.runName": sweep_title(info)[:250],
        "mlflow.source.type": "LOCAL",
        "mlflow.source.name": "run.py",
        "mlflow.user": user_name(),
        "mlflow.note.content": opening(info),
        "sweep_dir": info["sweep_dir"],
        "launcher": info["launcher"],
        "overrides": " ".join(info["overrides"])[:5000],
    }
    from runner.record.environment import git_source

    tags.update(git_tags(git_source()))
    run = retry_on_lock(mlflow.create_run, experiment_id, tags=tags)
    retry_on_lock(mlflow.set_experiment_tag, experiment_id, *runs_view_tag())  # an experiment made before it too
    swept = dict(split_override(o) for o in info["overrides"])  # the last of a key wins
    params = [Param(param_name(k), v) for k, v in swept.items() if not k.startswith("tracking.")]  # as the jobs
    if params:
        retry_on_lock(mlflow.log_batch, run.info.run_id, params=params)
    return run.info.run_id


def opening(info: dict) -> str:
    """The parent's description before its answer: what it sweeps, where, and the command that ran it."""
    command = " ".join(["python run.py -m", *info["overrides"], *info.get("hydra_overrides", [])])
    return f"{sweep_title(info)}  \nin {info['sweep_dir']}  \n`{command}`"[:5000]


def param_name(key: str) -> str:
    """An override's key as the jobs' params name it: a config group's choice is `GROUP.name` (`backend.name`)."""
    return f"{key}.name" if (CONFIG_DIR / key).is_dir() else key


UNLESS_SOME = ("n_failed", "n_killed")  # counts logged only where some jobs did not finish (n_finished < n_jobs)


GUIDE = "how-to-read.md"  # a sweep's artifact that explains its answer's words (docs/sweeps.md#how-to-read-this)
CHART = "report/speedup.png"  # each configuration's time / the fastest's with its interval (runner.report.plots)
FIGURES = (  # drawn in the parent's description under its table, where the report made them
    (CHART, "time / the fastest configuration, with 95% intervals"),
    ("report/token_latency.png", "time to each new token"),
)


def close_parent_run(
    info: dict, counts: dict[str, int], files: list[Path], status: str, answer=None, warnings: Sequence[str] = ()
) -> None:
    """Log a sweep's job counts and summary files to its parent run and end it with `status`. Its `answer`
    (runner.report.sweep_answer.Answer) goes first in the description the UI shows (with the chart and the sweep's
    `warnings`, see description), its details after the command, its verdict into tags and its pooled figures into
    metrics (what the runs list can show)."""
    from mlflow.entities import Metric, RunTag

    uri, run_id = info["uri"], info["parent_run_id"]
    mlflow = client(uri)
    now = int(time.time() * 1000)
    try:
        shown = {k: v for k, v in counts.items() if v or k not in UNLESS_SOME}  # no bar reading 0.00
        values = {**shown, **(answer.metrics() if answer else {})}
        tags = [RunTag(k, v) for k, v in (answer.tags() if answer else {}).items()]
        metrics = [Metric(k, float(v), now, 0) for k, v in values.items()]
        retry_on_lock(mlflow.log_batch, run_id, metrics=metrics, tags=tags)
        if answer:
            logged = {f"report/{p.name}" if p.parent.name == "report" else p.name for p in files if p.exists()}
            experiment_id = mlflow.get_run(run_id).info.experiment_id
            note = fit_note(description(info, answer, warnings, logged, experiment_id))
            retry_on_lock(mlflow.set_tag, run_id, "mlflow.note.content", note)
        log_files(uri, run_id, [p for p in files if p.parent.name != "report"])
        log_files(uri, run_id, [p for p in files if p.parent.name == "report"], "report")
    finally:  # ended whatever could not be logged: never left RUNNING (sync logs the files again)
        retry_on_lock(mlflow.set_terminated, run_id, status)


def description(info: dict, answer, warnings: Sequence[str], artifacts: set[str], experiment_id: str) -> str:
    """A sweep parent's description: the answer's sentence; a line pointing to how to read it (GUIDE, an artifact
    opened in the UI), to the charts and to the warnings; what one call is; the configurations' table; the charts
    themselves (FIGURES, drawn from the run's artifacts); the sweep's warnings as the terminal printed them; then what
    was swept, where and by what command, and a row per job."""
    run_id = info["parent_run_id"]
    drawn = [(figure, alt) for figure, alt in FIGURES if figure in artifacts]
    pointers = []
    if GUIDE in artifacts:
        guide = f"#/experiments/{experiment_id}/runs/{run_id}/artifacts/{GUIDE}?workflowType=machine_learning"
        pointers.append(f"[how to read this]({guide})")  # opened in the UI's model-training view
    if drawn:
        pointers.append(f"the chart{'s' * (len(drawn) > 1)} under the table")
    if warnings:
        count = f"{len(warnings)} warning{'s' * (len(warnings) != 1)}"
        pointers.append(f"{count} under {('them' if len(drawn) > 1 else 'it') if drawn else 'the table'}")
    parts = [answer.headline, answer.call, " · ".join(pointers), answer.table]
    # the UI's own address for an artifact, relative to the page: any host, port or prefix
    parts += [f"![{alt}](get-artifact?path={quote(figure, safe='')}&run_uuid={run_id})" for figure, alt in drawn]
    if warnings:
        parts.append("".join(f"warning: {line}  \n" for line in warnings).rstrip())
    parts += [opening(info), answer.details]
    return "\n\n".join(p for p in parts if p)

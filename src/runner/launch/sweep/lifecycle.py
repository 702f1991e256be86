"""A sweep's lifecycle: sweep.json and the MLflow parent run, opened before its jobs and closed once after them.

`start` creates the experiment once (so parallel jobs never race on a fresh SQLite store) and the parent run, and
writes `sweep.json` in the sweep directory, where every job (in this process, a joblib worker or a SLURM node
sharing the directory) reads the parent's id. `finish` prints the summary (runner.launch.sweep.summary), logs its
files to the parent run, ends the parent with a truthful status and returns the sweep's exit code. The sweep's
state is its sweep.json; `finish` acts once (its status is written).
"""

from __future__ import annotations

import logging
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from omegaconf import DictConfig

from runner import tracking
from runner.config import first_line
from runner.launch import launchers
from runner.launch.sweep import summary
from runner.record import naming, runs
from runner.record.result import Status
from runner.record.sweep_file import SWEEP_FILE, read_sweep_file, write_sweep_file

log = logging.getLogger(__name__)

EXIT_INTERRUPTED = 130
EXIT_CODES: dict[str, int] = {Status.FINISHED: 0, Status.FAILED: 1, Status.KILLED: EXIT_INTERRUPTED}


@dataclass
class Sweep:
    sweep_dir: Path
    info: dict  # sweep.json


def start(config: DictConfig) -> Sweep:
    """Create the sweep directory, the parent run (when tracked) and sweep.json."""
    if launchers.cluster_launcher(config.hydra.launcher):
        refuse_local_devices(config.hydra.sweeper.get("params"))
    sweep_dir = Path(str(config.hydra.sweep.dir)).resolve()
    sweep_dir.mkdir(parents=True, exist_ok=True)
    overrides = [str(o) for o in config.hydra.overrides.task]
    info = {
        "sweep_dir": str(sweep_dir),
        "overrides": overrides,
        "hydra_overrides": [str(o) for o in config.hydra.overrides.hydra if not str(o).startswith("hydra.mode=")],
        "sweeper_params": {str(k): str(v) for k, v in (config.hydra.sweeper.get("params") or {}).items()},
        "launcher": str(config.hydra.launcher.get("_target_", "")),
        "tracking": str(config.tracking.name),
        "uri": config.tracking.uri,
        "experiment": config.tracking.experiment,
        "parent_run_id": None,
        "started": time.strftime("%Y-%m-%d %H:%M:%S"),
    }
    info["timed"] = timed(config, naming.swept_keys(overrides, info["sweeper_params"]))
    parallel = launchers.parallel_launcher(config.hydra.launcher)
    if parallel:
        log.warning(
            f"{parallel}: jobs that run at the same time share cores, caches and memory bandwidth, "
            "so their timings disturb each other; time what you publish with the basic launcher"
        )
    local_store = info["tracking"] == "mlflow" and str(info["uri"]).startswith(("sqlite:", "file:", "/"))
    if local_store and launchers.cluster_launcher(config.hydra.launcher):
        log.warning(
            f"tracking.uri={info['uri']} is a file on this machine, and every node of the cluster writes "
            "to it: it must be on a file system they all share, where SQLite locks badly; set MLFLOW_TRACKING_URI "
            "to an `mlflow server` the nodes can reach"
        )
    if info["tracking"] == "mlflow":
        try:
            info["parent_run_id"] = tracking.create_parent_run(info)
        except Exception as error:  # the store is down: jobs keep their results locally for `runner sync`
            info["error"] = first_line(error)
            log.warning(f"no parent run in MLflow at {info['uri']} ({info['error']})")
    write_sweep_file(sweep_dir, info)
    return Sweep(sweep_dir, info)


def timed(config: DictConfig, swept: dict[str, str]) -> str:
    """What the sweep times where it fixes a task, optimizer, model or precision other than the defaults
    ('train_step (adam) on mlp'; runner.record.naming.what_was_timed), for its parent's name."""
    from omegaconf import OmegaConf

    task = cast(dict, OmegaConf.to_container(config.task, resolve=True))  # a DictConfig's: a dict
    chosen = {g: OmegaConf.select(config, f"{g}.name") for g in naming.TIMED_GROUPS if g not in naming.READ_BY_TASKS}
    read = naming.read_by_task({"task": task})  # a group the task reads: said only then
    fixed = {g: v for g, v in {**chosen, **read}.items() if g not in swept}
    return naming.what_was_timed(fixed)


def refuse_local_devices(params: DictConfig | None) -> None:
    """A sweep sent to other machines cannot take its devices from `${runner.devices:}`: it would list the
    devices of this, the submitting host, which may lack the nodes' GPUs. One line, exit 1."""
    from omegaconf import OmegaConf

    swept = cast(dict[str, Any], OmegaConf.to_container(params, resolve=False)) if params else {}  # a DictConfig's
    for key, value in swept.items():
        if "${runner.devices:" in str(value):
            print(
                f"error: {key}: ${{runner.devices:}} lists the devices of this host, not of the nodes the jobs run "
                f"on: name them instead ({key}=cpu,cuda)",
                file=sys.stderr,
            )
            raise SystemExit(1)


def parent_run_id(sweep_dir: str | Path) -> str | None:
    """In a job: the id of its sweep's parent run, if the sweep has one."""
    return read_sweep_file(Path(sweep_dir).resolve()).get("parent_run_id")


def note_jobs_launched(sweep_dir: Path, count: int) -> None:
    """How many jobs the sweep has launched so far (sweep.json), so each job's line can say `[k/N]`."""
    info = read_sweep_file(sweep_dir)
    if info:
        write_sweep_file(sweep_dir, {**info, "jobs_launched": count})


def record_launch_error(sweep_dir: Path, line: str) -> None:
    """A launcher refused the sweep: the reason goes into sweep.json (finish prints it) and onto the parent run."""
    info = read_sweep_file(sweep_dir)
    info["launch_error"] = line
    write_sweep_file(sweep_dir, info)
    if info.get("parent_run_id"):
        try:
            tracking.retry_on_lock(tracking.client(info["uri"]).set_tag, info["parent_run_id"], "error", line)
        except Exception as error:  # sweep.json keeps the reason whatever the store does
            log.warning(f"could not tag the parent run ({first_line(error)})")


def finish(sweep_dir: Path, interrupted: str | None = None) -> int:
    """Summarise and close the sweep in `sweep_dir` once; returns its exit code. `interrupted`: what stopped
    the sweep, if anything did."""
    from runner import report

    sweep = Sweep(Path(sweep_dir), read_sweep_file(sweep_dir))
    if sweep.info.get("status"):  # closed already
        return EXIT_CODES[sweep.info["status"]]
    frame = report.frame(runs.from_dirs(runs.runs_in(sweep.sweep_dir)))
    statuses = list(frame["status"]) if not frame.empty else []
    status = sweep_status(statuses, bool(interrupted))
    files: list[Path] = []
    if not frame.empty:
        summary.print_table(frame, sweep.sweep_dir)
        files = summary.write_files(frame, sweep.sweep_dir)
    elif not interrupted:
        reason = sweep.info.get("launch_error") or f"the sweep in {sweep.sweep_dir} recorded no job"
        print(f"error: {reason}", file=sys.stderr)
    sweep.info.update(status=status, ended=time.strftime("%Y-%m-%d %H:%M:%S"), n_jobs=len(statuses))
    write_sweep_file(sweep.sweep_dir, sweep.info)
    if sweep.info.get("parent_run_id"):
        close_parent(sweep, statuses, status, files)
    return EXIT_CODES[status]


def sweep_status(statuses: list[str], interrupted: bool) -> str:
    """FINISHED only when every job finished; KILLED when the sweep was stopped; FAILED otherwise."""
    if interrupted or Status.KILLED in statuses:
        return Status.KILLED
    if not statuses or any(s != Status.FINISHED for s in statuses):
        return Status.FAILED
    return Status.FINISHED


def close_parent(sweep: Sweep, statuses: list[str], status: str, files: list[Path]) -> None:
    """End the parent run with the jobs' counts, the sweep's files and its answer; sweep.json notes it closed."""
    from runner import report

    counts = {
        "n_jobs": len(statuses),
        "n_finished": statuses.count(Status.FINISHED),
        "n_failed": statuses.count(Status.FAILED),
        "n_killed": statuses.count(Status.KILLED),
    }
    files = [sweep.sweep_dir / SWEEP_FILE, sweep.sweep_dir / "multirun.yaml", *files]
    try:
        frame = report.frame(runs.from_dirs(runs.runs_in(sweep.sweep_dir)))
        answer = report.answer(frame) if not frame.empty else None
        warnings = summary.sweep_warnings(frame, sweep.sweep_dir) if not frame.empty else []
        tracking.close_parent_run(sweep.info, counts, files, status, answer, warnings)
        sweep.info["parent_closed"] = True
        write_sweep_file(sweep.sweep_dir, sweep.info)
    except Exception as error:
        log.warning(f"could not close the parent run {sweep.info['parent_run_id']} ({first_line(error)})")

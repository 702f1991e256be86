"""What a cluster launcher (SLURM, Ray) does for the jobs it sends away: refuse a sweep before anything is
submitted, find a job's config and directory as the job itself had them, record a job the cluster
ended before it could record itself, and run a block of jobs on one node (the node as a block)."""

from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig, open_dict

from runner.launch import launchers
from runner.record.result import Status
from runner.spec import JobSpec


def refuse(line: str) -> None:
    """No job submitted: the sweep is refused in one line, recorded on the sweep (sweep.json, parent run), exit 1."""
    raise launchers.SweepRefused(line)


def job_config(hydra_context, sweep_config: DictConfig, overrides: list[str], index: int) -> tuple[Path, JobSpec]:
    """The job's run directory and its spec, composed from Hydra's sweep config as the job itself had them."""
    from hydra.core.hydra_config import HydraConfig

    from runner.record.naming import job_spec

    config = hydra_context.config_loader.load_sweep_config(sweep_config, overrides)
    with open_dict(config.hydra.job):
        config.hydra.job.num = index
    HydraConfig.instance().set_config(config)
    run_dir = Path(str(config.hydra.sweep.dir)) / str(config.hydra.sweep.subdir)
    with open_dict(config):
        del config["hydra"]
    return run_dir, job_spec(config)


Numbered = list[tuple[int, list[str]]]  # (job number, its overrides): a block's jobs


def none_can_run(configs: list[tuple[int, DictConfig]]) -> str | None:
    """Where no job of the sweep can run, each (number, composed config) refused by the combination rules
    (runner.config.check_combination), the one line that refuses the sweep before a cluster is asked for anything:
    submitted, each job would only be recorded FAILED on a node. None where one job can run: the others are then
    recorded FAILED in their turn, beside it, as on one machine."""
    from runner.config import ConfigError, check_combination
    from runner.record.naming import described

    refused: list[tuple[int, str]] = []
    for number, config in configs:
        try:
            check_combination(described(config))
        except ConfigError as error:
            refused.append((number, str(error)))
            continue
        return None
    if not refused:
        return None
    (number, why), more = refused[0], len(refused) - 1
    others = f" (and the {more} other job{'s' * (more != 1)} of the sweep)" if more else ""
    return f"no job of the sweep can run, so nothing is submitted: job #{number}{others}: {why}"


def blocks_asked(value: object) -> int | None:
    """hydra.launcher.blocks as the launchers take it: None (a node per job) or a number of nodes, 1 or more; anything
    else refused in one line (preflight refuses it first where it is given on the command line)."""
    if line := blocks_error(value):
        refuse(line)
    return None if value is None else int(value)  # type: ignore[call-overload]  # an int >= 1, as checked


def blocks_error(value: object) -> str | None:
    """What is wrong with a value of hydra.launcher.blocks, in one line; None where it is a number of nodes or null
    (-1 failed to unpack, 10**9 ran out of memory making its blocks, 0 was taken as not set)."""
    if value is None or (isinstance(value, int) and not isinstance(value, bool) and value >= 1):
        return None
    return (
        f"hydra.launcher.blocks={value}: the number of nodes that each run every job of the sweep, 1 or more "
        "(null: a node per job)"
    )


def blocks_of(job_overrides, first: int, blocks: int) -> list[Numbered]:
    """The node as a block (hydra.launcher.blocks): every job of the sweep in each of `blocks` blocks, block b's
    numbered first + b * len(job_overrides) on."""
    k = len(job_overrides)
    return [[(first + b * k + j, list(o)) for j, o in enumerate(job_overrides)] for b in range(blocks)]


def run_block(hydra_context, task_function, sweep_config: DictConfig, numbered: Numbered, singleton_state: dict):
    """On the block's node: its jobs in interleaved rounds, as the rounds launcher runs a sweep on one machine (each
    a run of its own, recording this node as its host). Returns their JobReturns."""
    from hydra.core.singleton import Singleton
    from hydra.core.utils import setup_globals

    from runner.launch.local_launcher import RoundsLauncher

    setup_globals()
    Singleton.set_state(singleton_state)
    rounds = RoundsLauncher(notes_jobs_launched=False)  # the sweep's count is the submitting host's to keep
    rounds.setup(hydra_context=hydra_context, task_function=task_function, config=sweep_config)
    return list(rounds.launch([overrides for _, overrides in numbered], numbered[0][0]))


def finished(run_dir: Path) -> bool:
    """Whether the job recorded itself FINISHED in run_dir (result.json): its measurements are whole."""
    from runner.record.result import Result

    return Result.exists(run_dir) and Result.load(run_dir).status == Status.FINISHED


def record_ended(spec: JobSpec, run_dir: Path, reason: str, context: dict[str, str]) -> None:
    """Record a job the cluster ended (runner.record.job_record.ended_by_cluster), in result.json and in
    MLflow where tracked."""
    from runner.launch.sweep.lifecycle import parent_run_id
    from runner.record import job_record

    if job_record.ended_by_cluster(spec, run_dir, reason, context):
        _update_tracked(spec.mlflow_store(), run_dir, parent_run_id(run_dir.parent))


def _update_tracked(store: tuple[str, str] | None, run_dir: Path, parent: str | None) -> None:
    """Log the amended record: a new run when the job never reached MLflow (no link, or the pending one a
    job writes before it starts), else its run corrected."""
    from runner import tracking
    from runner.record.result import RESULT_FILE, Result

    if store is None:
        return
    link = tracking.read_link(run_dir)
    if not link.get("run_id"):
        tracking.track(run_dir, *store, parent)
    else:
        mlflow = tracking.client(link["uri"])
        error = Result.load(run_dir).error or ""  # ended_by_cluster wrote one
        tracking.retry_on_lock(mlflow.set_tag, link["run_id"], "error", error[:5000])
        tracking.log_files(link["uri"], link["run_id"], [run_dir / RESULT_FILE])
        tracking.retry_on_lock(mlflow.set_terminated, link["run_id"], Status.FAILED)

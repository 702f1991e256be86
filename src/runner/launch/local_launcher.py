"""The launcher of a sweep on this machine (`hydra/launcher=rounds`, the default): its jobs one after the
other, those that compare measured in interleaved rounds (runner.launch.rounds).

For each job, in order: its config is composed as Hydra composes it; a job measured in rounds
(rounds.wanted: a worker process, timing.rounds above 1) is set up in its worker and waits, any other job
runs at once through Hydra's `run_job` with the task function (run.py's `main`). Once every job is set up,
the rounds hand out the turns; then each waiting job goes through `run_job` too, with a task that returns
what its worker recorded. So every job is one `run_job`: Hydra's callbacks see each job start and end once,
with its real value, and sweepers (an optimizing one included) get every job's median, in rounds too.
"""

from __future__ import annotations

import copy
import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, cast

from hydra.core.config_loader import ConfigLoader
from hydra.core.hydra_config import HydraConfig
from hydra.core.utils import JobReturn, configure_log, filter_overrides, run_job, setup_globals
from hydra.plugins.launcher import Launcher
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig, OmegaConf, open_dict, read_write

from runner.launch import control, rounds
from runner.launch.job_return import job_return
from runner.launch.sweep import lifecycle, summary
from runner.launch.sweep_lines import Every, time_left
from runner.measure.stop import SIGTERM, Stopped, stop_reason
from runner.record.naming import job_spec, run_name
from runner.record.result import Result, Status
from runner.record.sweep_file import note_control
from runner.spec import JobSpec

log = logging.getLogger(__name__)


@dataclass
class _Job:
    number: int
    config: DictConfig  # with its `hydra` node, as run_job takes it
    task_cfg: DictConfig  # what the task function gets
    run_dir: Path


def _say_if_it_is_the_controls_work(spec: JobSpec, number: int, control_case: tuple[int, str]) -> None:
    """One line where a sweep's own job does the work of the control the control group adds (issue 79): the control
    is that added job alone, and this one is compared as any other."""
    from runner.identity import case

    if case(spec.params(), run_name(spec.config)).key == control_case[1]:
        log.warning(f"job #{number} does the control's own work: the control is job #{control_case[0]}, the one "
                    "control= adds; this job is timed and compared as the sweep's other jobs")  # fmt: skip


class RoundsLauncher(Launcher):
    def __init__(self, notes_jobs_launched: bool = True) -> None:
        self.notes_jobs_launched = notes_jobs_launched  # False in a cluster's block: the sweep's count is not its own

    # What setup() is given: Hydra calls it before launch().
    config: DictConfig
    task_function: TaskFunction
    hydra_context: HydraContext
    _configs: _ComposedOnce

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        self.config, self.hydra_context, self.task_function = config, hydra_context, task_function
        loader = hydra_context.config_loader
        self._configs = loader if isinstance(loader, _ComposedOnce) else _ComposedOnce(loader)
        hydra_context.config_loader = cast(ConfigLoader, self._configs)  # the sweeper's too: it holds this context

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        setup_globals()
        configure_log(self.config.hydra.hydra_logging, self.config.hydra.verbose)
        sweep_dir = Path(str(self.config.hydra.sweep.dir))
        sweep_dir.mkdir(parents=True, exist_ok=True)
        parent = lifecycle.parent_run_id(sweep_dir)
        coordinator = rounds.Coordinator()
        returns: dict[int, JobReturn] = {}
        waiting: list[_Job] = []
        jobs = list(job_overrides)
        control_job = control.job_overrides(self.config, jobs[0]) if jobs else None
        control_case = None
        if control_job is not None:  # noted before any job runs: each records which case its control is
            jobs.append(control_job)
            control_case = self._note_control(sweep_dir, control_job, initial_job_idx + len(job_overrides))
        if self.notes_jobs_launched:
            lifecycle.note_jobs_launched(sweep_dir, initial_job_idx + len(jobs))
        progress = Every(log)
        try:
            for number, overrides in enumerate(jobs, initial_job_idx):
                log.debug(f"\t#{number} : {' '.join(filter_overrides(overrides))}")  # Hydra's line, per job
                job = self._job(list(overrides), number)
                spec = job_spec(job.task_cfg)
                if control_case and number < initial_job_idx + len(job_overrides):
                    _say_if_it_is_the_controls_work(spec, number, control_case)
                if not rounds.wanted(spec):
                    returns[number] = self._run(job, self.task_function)
                    continue
                self._set_up(job, spec, coordinator, parent)
                waiting.append(job)
                _say_set_up(progress, len(waiting), len(jobs))
            coordinator.run(measured=summary.import_report_meanwhile)
        except KeyboardInterrupt as stop:
            coordinator.run(stopped_by=stop_reason(stop))  # the jobs set up so far record what they have
            raise
        for job in waiting:
            returns[job.number] = self._run(job, partial(_measured, coordinator.outcomes[job.run_dir]))
        # the sweeper gets its own jobs' returns: the control is the launcher's addition
        return [returns[number] for number in sorted(returns)][: len(job_overrides)]

    def _note_control(self, sweep_dir: Path, overrides: list[str], number: int) -> tuple[int, str]:
        """The control job's case in sweep.json (runner.record.sweep_file.note_control); its number and case."""
        from runner.identity import case

        job = self._job(overrides, number)
        spec = job_spec(job.task_cfg)
        found = case(spec.params(), run_name(spec.config))
        note_control(sweep_dir, number, job.run_dir.name, found.key, found.name)
        return number, found.key

    def _set_up(self, job: _Job, spec: JobSpec, coordinator: rounds.Coordinator, parent: str | None) -> None:
        """Set the job up in its worker, to wait for its turns; a job that ended meanwhile keeps its record."""
        _save_overrides(job)
        ended = coordinator.set_up(spec, job.run_dir, parent)
        if ended is not None:
            coordinator.outcomes[job.run_dir] = ended
            if ended.status == Status.KILLED:  # Ctrl-C or SIGTERM while it was set up
                raise Stopped(ended.stopped_by or SIGTERM)

    def _job(self, overrides: list[str], number: int) -> _Job:
        """The job's config as Hydra's basic launcher composes it, and what run_job would give its task."""
        config = self._configs.take(self.config, overrides)
        with open_dict(config):
            config.hydra.job.id = number
            config.hydra.job.num = number
        HydraConfig.instance().set_config(config)  # the task's config resolves `${hydra:...}` against it
        task_cfg = copy.deepcopy(config)
        with read_write(task_cfg), open_dict(task_cfg):
            del task_cfg["hydra"]
        run_dir = Path(os.path.abspath(Path(str(config.hydra.sweep.dir)) / str(config.hydra.sweep.subdir)))
        return _Job(number, config, task_cfg, run_dir)

    def _run(self, job: _Job, task_function: TaskFunction) -> JobReturn:
        ret = run_job(
            hydra_context=self.hydra_context,
            task_function=task_function,
            config=job.config,
            job_dir_key="hydra.sweep.dir",
            job_subdir_key="hydra.sweep.subdir",
        )
        configure_log(self.config.hydra.hydra_logging, self.config.hydra.verbose)
        return ret


class _ComposedOnce:
    """Hydra's config loader, whose sweep configs are composed once a job: the sweeper composes every job of a batch
    to check it (Sweeper.validate_batch_is_legal) and drops the configs, then this launcher composed each again
    (~0.3 s a job on 2 cores). Here the configs the sweeper had composed are kept for the launcher to take."""

    def __init__(self, loader: ConfigLoader):
        self._loader = loader
        self._composed: dict[tuple[str, ...], list[tuple[DictConfig, DictConfig]]] = {}

    def load_sweep_config(self, master_config: DictConfig, sweep_overrides: list[str]) -> DictConfig:
        config = self._loader.load_sweep_config(master_config, sweep_overrides)
        self._composed.setdefault(tuple(sweep_overrides), []).append((master_config, config))
        return config

    def take(self, master_config: DictConfig, sweep_overrides: list[str]) -> DictConfig:
        """The job's config: one composed before for these overrides, else composed now."""
        kept = self._composed.get(tuple(sweep_overrides))
        if kept and kept[0][0] is master_config:
            return kept.pop(0)[1]
        return self._loader.load_sweep_config(master_config, sweep_overrides)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._loader, name)


def _say_set_up(progress: Every, done: int, total: int) -> None:
    """A line every few seconds while the jobs are set up for the rounds (none when that is quick)."""
    elapsed = progress.elapsed()
    left = time_left(elapsed, done, total)
    progress.say(f"{done} of {total} jobs set up for the rounds, {elapsed:.1f} s so far{left}")


def _save_overrides(job: _Job) -> None:
    """The job's .hydra/overrides.yaml, which run_job writes only when the job's task runs: MLflow names the
    run by its swept values (runner.record.naming.job_context) when the rounds log it, before that."""
    if job.config.hydra.output_subdir is None:
        return
    folder = job.run_dir / str(job.config.hydra.output_subdir)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "overrides.yaml").write_text(OmegaConf.to_yaml(job.config.hydra.overrides.task))


def _measured(outcome: Result, cfg: DictConfig) -> float:
    """The task of a job measured in the rounds: what its worker recorded, as run.py's task returns it."""
    return job_return(Path(HydraConfig.get().runtime.output_dir), outcome, multirun=True)

"""SLURM sweeps that fit the cluster they are sent to (`hydra/launcher=slurm`, submitit underneath).

`SlurmLauncher` is hydra-submitit-launcher's, changed where a real cluster showed it wanting:
- Every job is submitted with `--exclusive` (`hydra.launcher.exclusive`, true by default) so jobs never share
  a node while they time; `mem_gb` left null is then `--mem=0` (all of the node's memory), and
  `cpus_per_task` left null is the cores of the partition's smallest node that can hold the job.
- A job whose config has `device=cuda` asks for `gpus_per_cuda_job` GPUs (unless `gpus_per_node`,
  `gpus_per_task` or a GPU `gres` is set, which every job then asks for); jobs asking differently are
  submitted as separate arrays.
- Before anything is submitted it reads the partition with `sinfo`: a request no node of the partition can
  hold (cores, memory, GPUs, nodes, time) is refused with one line, the sweep exits 1 and its parent run is
  FAILED.
- It logs each job's overrides as submitit's launcher does, and applies `hydra.sweep.mode` to the sweep
  directory when set.
- It follows the jobs with `squeue` (which works without SLURM accounting) rather than submitit's `sacct`
  polling, and prints a line only when a job changes state: queued and why, running, ended.
- A job pending for a reason that waiting cannot resolve (`PERMANENT_REASONS`: the partition cannot
  ever give it what it asks, is down, ...) is cancelled after `PENDING_GRACE_S`; `Resources`, `Priority`
  and other reasons just wait.
- A job SLURM ends (its time limit, a cancel, a node failure, out of memory) is recorded FAILED with
  SLURM's state and reason, in result.json and in MLflow; the other jobs of the sweep are untouched.
- submitit's "Bypassing sacct error" warning, should submitit still call sacct, is shown once with what
  it means.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import signal
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hydra.core.singleton import Singleton
from hydra.core.utils import JobReturn, JobStatus, filter_overrides
from hydra_plugins.hydra_submitit_launcher.config import SlurmQueueConf
from hydra_plugins.hydra_submitit_launcher.submitit_launcher import SlurmLauncher as SubmititSlurmLauncher
from omegaconf import OmegaConf

from runner.config import first_line
from runner.launch import cluster_jobs
from runner.launch.slurm_fit import (
    LaunchRefused,
    blocks_refusal,
    executor_parameters,
    fit_arrays,
    gpus_set,
    read_partition,
    sbatch_summary,
    sweep_mode,
)
from runner.launch.slurm_queue import Follower, JobState, quiet_sacct_warnings
from runner.spec import JobSpec

log = logging.getLogger(__name__)


@dataclass
class SlurmConf(SlurmQueueConf):
    """hydra-submitit-launcher's SLURM settings and this launcher's own (conf/hydra/launcher/slurm.yaml)."""

    _target_: str = "hydra_plugins.tensor_runner.slurm_launcher.SlurmLauncher"
    exclusive: bool = True  # sbatch --exclusive: a node per job
    gpus_per_cuda_job: int = 1  # gpus_per_node of a device=cuda job, unless GPUs are asked for explicitly
    blocks: int | None = None  # N: N nodes, each running every job of the sweep in interleaved rounds (a block)


class SlurmLauncher(SubmititSlurmLauncher):
    """hydra-submitit-launcher's SLURM launcher: a node per job, fitted to the partition, followed with squeue."""

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        quiet_sacct_warnings()
        blocks = cluster_jobs.blocks_asked(self.params.get("blocks"))
        if blocks:
            return self._launch_blocks(job_overrides, initial_job_idx, blocks)
        try:
            partition = read_partition(self.params.get("partition"))
            self._refuse_if_none_can_run(job_overrides, initial_job_idx)
            devices = self._devices(job_overrides, initial_job_idx)
            arrays = fit_arrays(self.params, devices, partition, initial_job_idx)
            sweep_dir = self._sweep_dir()
        except LaunchRefused as error:
            cluster_jobs.refuse(str(error))
        jobs = self._submit(job_overrides, initial_job_idx, arrays, sweep_dir)
        follower = Follower(jobs, first=initial_job_idx)
        states = follower.run()
        return [
            self._job_return(job, list(overrides), initial_job_idx + i, states[job.job_id])
            for i, (job, overrides) in enumerate(zip(jobs, job_overrides, strict=True))
        ]

    def __call__(self, *args: Any, **kwargs: Any) -> JobReturn:
        # In the job. SLURM sends USR2 `signal_delay_s` before the time limit to every process of the job,
        # the measuring worker included, whose default action would be to die at once; submitit's own handler
        # would raise in the middle of the job. Ignored (inherited by the worker), the job runs to its limit.
        signal.signal(signal.SIGUSR2, signal.SIG_IGN)
        return super().__call__(*args, **kwargs)

    def _launch_blocks(self, job_overrides: Sequence[Sequence[str]], first: int, blocks: int) -> list[JobReturn]:
        """The node as a block: `blocks` SLURM jobs, each on a node of its own (--exclusive), each running every job
        of the sweep in interleaved rounds (runner.launch.rounds), numbered first + b * len(job_overrides) on. Each
        node's runs record its host; the answer pools the nodes as replicates (runner.report.ratio.node_spread)."""
        try:
            partition = read_partition(self.params.get("partition"))
            if refusal := blocks_refusal(blocks, partition):  # each block a node of its own that takes jobs
                raise LaunchRefused(refusal)
            self._refuse_if_none_can_run(job_overrides, first)
            devices = self._devices(job_overrides, first)
            device = "cuda" if "cuda" in devices else devices[0] if devices else ""
            ((request, _),) = fit_arrays(self.params, [device] * blocks, partition, 0)
            sweep_dir = self._sweep_dir()
        except LaunchRefused as error:
            cluster_jobs.refuse(str(error))
        numbered = cluster_jobs.blocks_of(job_overrides, first, blocks)
        for number, overrides in (job for block in numbered for job in block):
            log.info(f"\t#{number} : {' '.join(filter_overrides(overrides))}")
        # a block SLURM would requeue after its node failed would run again on a node that ran one already: ended
        request["additional_parameters"] = {**(request.get("additional_parameters") or {}), "no_requeue": True}
        executor = self._executor(request)
        summary = sbatch_summary(executor._executor.parameters)
        print(
            f"slurm: submitting {blocks} blocks of {len(job_overrides)} jobs ({summary}); sweep in {sweep_dir}",
            flush=True,
        )
        jobs = executor.map_array(self.run_block, numbered, [Singleton.get_state()] * blocks)
        follower = Follower(jobs, first=1, noun="block ")
        states = follower.run()
        print(f"slurm: {nodes_line([states[job.job_id] for job in jobs])}", flush=True)
        return [
            ret for job, block in zip(jobs, numbered, strict=True) for ret in self._block_returns(job, block, states)
        ]

    def run_block(self, numbered: cluster_jobs.Numbered, singleton_state: dict) -> list[JobReturn]:
        """On the block's node (runner.launch.cluster_jobs.run_block)."""
        signal.signal(signal.SIGUSR2, signal.SIG_IGN)  # as __call__ does
        return cluster_jobs.run_block(self.hydra_context, self.task_function, self.config, numbered, singleton_state)

    def _block_returns(self, job: Any, numbered: list[tuple[int, list[str]]], states: dict) -> list[JobReturn]:
        """A block's jobs' returns; where SLURM ended the block, each of its jobs is recorded FAILED with why."""
        state: JobState = states[job.job_id]
        returned: list[JobReturn] = []
        if job.paths.result_pickle.exists():
            with contextlib.suppress(Exception):  # a block that raised: its jobs are recorded below
                returned = job.results()[0]
        if len(returned) == len(numbered) and state.state in ("COMPLETED", "UNKNOWN_END") and not state.extra:
            return returned
        if state.state == "TIMEOUT":
            state.extra += f": past its time limit, hydra.launcher.timeout_min={self.params.get('timeout_min')}"
        ended = []
        for number, overrides in numbered:
            run_dir, spec = cluster_jobs.job_config(self.hydra_context, self.config, overrides, number)
            record_slurm_end(spec, run_dir, state)
            ended.append(
                JobReturn(
                    overrides=overrides, working_dir=str(run_dir), status=JobStatus.COMPLETED, _return_value=math.nan
                )
            )
        return ended

    def _devices(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> list[str]:
        """Each job's device.name from its composed config, where it decides the GPUs asked for."""
        if gpus_set(self.params) or not self.params.get("gpus_per_cuda_job"):
            return [""] * len(job_overrides)
        return [self._device(list(o), initial_job_idx + i) for i, o in enumerate(job_overrides)]

    def _device(self, overrides: list[str], number: int) -> str:
        return str(OmegaConf.select(self._job_config(overrides, number), "device.name", default=""))

    def _job_config(self, overrides: list[str], number: int) -> Any:
        """The job's composed config; LaunchRefused where it cannot compose."""
        try:
            return self.hydra_context.config_loader.load_sweep_config(self.config, overrides)
        except Exception as error:  # what the job itself would fail with on its node
            raise LaunchRefused(f"job #{number} ({' '.join(overrides)}): {first_line(error)}") from error

    def _refuse_if_none_can_run(self, job_overrides: Sequence[Sequence[str]], first: int) -> None:
        """LaunchRefused where no job of the sweep can run (cluster_jobs.none_can_run): nothing is submitted."""
        configs = [(first + i, self._job_config(list(o), first + i)) for i, o in enumerate(job_overrides)]
        if line := cluster_jobs.none_can_run(configs):
            raise LaunchRefused(line)

    def _sweep_dir(self) -> Path:
        """The sweep directory, made, with hydra.sweep.mode's permissions when set."""
        sweep_dir = Path(str(self.config.hydra.sweep.dir))
        mode = sweep_mode(self.config.hydra.sweep.get("mode"))
        sweep_dir.mkdir(parents=True, exist_ok=True)
        if mode is not None:
            os.chmod(sweep_dir, mode)
        return sweep_dir

    def _submit(
        self,
        job_overrides: Sequence[Sequence[str]],
        initial_job_idx: int,
        arrays: list[tuple[dict[str, Any], list[int]]],
        sweep_dir: Path,
    ) -> list[Any]:
        """One array per request; the jobs in the sweep's order. A failed sbatch cancels what was submitted."""
        from submitit.core.utils import FailedJobError, FailedSubmissionError

        for number, overrides in enumerate(job_overrides, initial_job_idx):
            log.info(f"\t#{number} : {' '.join(filter_overrides(overrides))}")
        jobs: list[Any] = [None] * len(job_overrides)
        try:
            for request, positions in arrays:
                numbered = [(initial_job_idx + p, list(job_overrides[p])) for p in positions]
                for position, job in zip(positions, self._submit_array(request, numbered, sweep_dir), strict=True):
                    jobs[position] = job
        except (FailedJobError, FailedSubmissionError) as error:
            submitted = [job.job_id for job in jobs if job is not None]
            if submitted:
                subprocess.run(["scancel", *submitted], capture_output=True, timeout=60)
            cluster_jobs.refuse(f"sbatch failed: {first_line(error)}")
        return jobs

    def _submit_array(self, request: dict[str, Any], numbered: list[tuple[int, list[str]]], sweep_dir: Path) -> list:
        """One SLURM array of the (job number, overrides) given, all asking for `request`."""
        executor = self._executor(request)
        summary = sbatch_summary(executor._executor.parameters)
        print(f"slurm: submitting {len(numbered)} jobs ({summary}); sweep in {sweep_dir}", flush=True)
        state = Singleton.get_state()
        params = [(overrides, "hydra.sweep.dir", n, f"job_id_for_{n}", state) for n, overrides in numbered]
        return executor.map_array(self, *zip(*params, strict=True))

    def _executor(self, request: dict[str, Any]) -> Any:
        import submitit

        executor = submitit.AutoExecutor(
            cluster="slurm",
            folder=request["submitit_folder"],
            slurm_max_num_timeout=request["max_num_timeout"],
        )
        executor.update_parameters(**executor_parameters(request))
        return executor

    def _job_return(self, job: Any, overrides: list[str], index: int, state: JobState) -> JobReturn:
        returned = None
        if state.state == "TIMEOUT":
            state.extra += f": past its time limit, hydra.launcher.timeout_min={self.params.get('timeout_min')}"
        if job.paths.result_pickle.exists():
            try:
                returned = job.results()[0]
            except Exception as error:
                state.extra += f": the job raised {first_line(error)}"
        if returned is not None and state.state in ("COMPLETED", "UNKNOWN_END") and not state.extra:
            return returned
        run_dir, spec = cluster_jobs.job_config(self.hydra_context, self.config, overrides, index)
        record_slurm_end(spec, run_dir, state)
        return returned or JobReturn(
            overrides=overrides, working_dir=str(run_dir), status=JobStatus.COMPLETED, _return_value=math.nan
        )


def record_slurm_end(spec: JobSpec, run_dir: Path, state: JobState) -> None:
    """Record a job SLURM ended as FAILED with SLURM's state and reason (runner.launch.cluster_jobs). A job that
    recorded itself FINISHED before its node was lost keeps its record: its measurements are whole."""
    if state.state == "NODE_FAIL" and cluster_jobs.finished(run_dir):
        return
    # named as a job records them (runner.record.environment): the node names a run that never recorded its host
    found = {"slurm_job_id": state.slurm_job_id, "slurm_node": state.placed_on}
    context = {k: v for k, v in found.items() if v}
    cluster_jobs.record_ended(spec, run_dir, state.describe(), context)


def nodes_line(states: list[JobState]) -> str:
    """Which nodes a sweep blocked by node rests on: 'the answer rests on 2 of 3 nodes: node-1, node-3 (block 2 on
    node-2 lost: NODE_FAIL)'."""
    done = sorted({s.node or "?" for s in states if s.state in ("COMPLETED", "UNKNOWN_END")})
    ended = ("COMPLETED", "UNKNOWN_END")
    lost = [f"block {i} on {s.node or 'no node'}: {s.state}" for i, s in enumerate(states, 1) if s.state not in ended]
    line = f"the answer rests on {len(done)} of {len(states)} nodes: {', '.join(done) or 'none'}"
    return line + (f" ({'; '.join(lost)})" if lost else "")

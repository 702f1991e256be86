"""Ray sweeps (`hydra/launcher=ray_cluster`): each job a Ray task on a running cluster.

`RayLauncher` is hydra-ray-launcher's, changed where the runner needs it:
- A job's resources follow its device: a `device=cuda` job asks Ray for `gpus_per_cuda_job` GPUs (Ray hides
  the GPUs from a task that asked for none, so a `device=auto` job, which asks for none, runs on the CPU, as
  on SLURM); a cuda job on a cluster without a GPU is refused in one line before anything is submitted.
- A job whose Ray task ends without a result (its worker process died: out of memory, a crash, a lost
  node) is recorded FAILED with Ray's reason, in result.json and in MLflow; the other jobs' results are
  collected as usual. Upstream, the first such job raised and the rest were never collected.
- `blocks: N`, the node as a block: N Ray tasks, one on each of N nodes (a placement group of N bundles, Ray's
  STRICT_SPREAD), each running every job of the sweep in interleaved rounds (runner.launch.cluster_jobs.run_block);
  the answer pools the nodes as replicates, as for SLURM.
- It fits the cluster or says why: a job (or block) asking for more than any node has (`num_cpus: 4` on 2-CPU
  nodes) is refused in one line before anything is submitted (ray.nodes()), and a placement group of blocks not
  placed within PLACEMENT_WAIT_S is refused naming what it asked and what the cluster has free. Upstream, such a
  sweep waited for ever, saying nothing.
- SIGTERM and Ctrl-C stop the sweep as on one machine (its parent run KILLED): ray.init replaces the process's
  SIGTERM handler with one that exits at once, so the runner's is put back.
- A job runs with the thread variables (runner.identity.SPEED_VARIABLES) of the environment that launched the sweep,
  as sbatch exports it: Ray sets OMP_NUM_THREADS to a task's num_cpus where it is unset, which would make a Ray run
  another machine than a run of the same job outside Ray.
- The launching process says each job's line as its task ends (and a progress line every few seconds meanwhile),
  from the job's result.json; the tasks' own output is not forwarded (`ray.init(log_to_driver=False)` unless
  hydra.launcher.ray.init.log_to_driver says otherwise). Forwarded, a line came once per node where nodes share a
  logs folder (each node's log monitor reads every worker's file there: three nodes on one machine, three times),
  and Ray's deduplication hid the lines of jobs that differ only in numbers (seed=1, seed=3) or nodes.
- Each run records the sweep's Ray job id (environment.ray_job_id): the task hands it to the job's measuring worker,
  in either mode. A Ray worker started before the job (as on the node the sweep is launched from) has no or the nil
  job id in its RAY_JOB_ID, which the blocks' workers inherited.
"""

from __future__ import annotations

import logging
import math
import os
import signal
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, cast

from hydra.core.utils import JobReturn, JobStatus, filter_overrides
from hydra_plugins.hydra_ray_launcher.ray_launcher import RayLauncher as UpstreamRayLauncher
from omegaconf import DictConfig, OmegaConf, open_dict

from runner.config import first_line
from runner.identity import SPEED_VARIABLES
from runner.launch import cluster_jobs
from runner.launch.sweep import lifecycle
from runner.launch.sweep_lines import PROGRESS_EVERY_S, Every, say_job_line, time_left
from runner.record import environment

log = logging.getLogger(__name__)
PLACEMENT_WAIT_S = 60.0  # how long the blocks' placement group may wait for its nodes before the sweep is refused


class RayLauncher(UpstreamRayLauncher):
    """hydra-ray-launcher's launcher with per-job GPU requests and crashed tasks recorded as FAILED."""

    def __init__(self, ray: DictConfig, gpus_per_cuda_job: float = 1, blocks: int | None = None) -> None:
        super().__init__(ray)
        self.gpus_per_cuda_job = gpus_per_cuda_job
        self.blocks = blocks

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        import ray
        from hydra.core.singleton import Singleton
        from hydra.core.utils import configure_log, setup_globals
        from hydra_plugins.hydra_ray_launcher._launcher_util import start_ray

        blocks = cluster_jobs.blocks_asked(self.blocks)  # before a Ray cluster is started for it
        if blocks and (line := unused_by_blocks(self.ray_cfg.remote)):
            cluster_jobs.refuse(line)
        setup_globals()
        configure_log(self.config.hydra.hydra_logging, self.config.hydra.verbose)
        Path(str(self.config.hydra.sweep.dir)).mkdir(parents=True, exist_ok=True)
        lifecycle.note_jobs_launched(Path(str(self.config.hydra.sweep.dir)), initial_job_idx + len(job_overrides))
        stop = signal.getsignal(signal.SIGTERM)
        start_ray(init_options(self.ray_cfg.init))
        signal.signal(signal.SIGTERM, stop)  # the runner's: the sweep stops as on one machine, its parent KILLED
        cluster_gpus = ray.cluster_resources().get("GPU", 0)
        indices = range(initial_job_idx, initial_job_idx + len(job_overrides))
        configs = [self._job_sweep_config(list(o), i) for o, i in zip(job_overrides, indices, strict=True)]
        # every job's options before any is submitted: a refused job leaves nothing running
        options = [self._remote(str(c.device.name), cluster_gpus) for c in configs]
        if line := cluster_jobs.none_can_run(list(zip(indices, configs, strict=True))):
            cluster_jobs.refuse(line)
        nodes = [node for node in ray.nodes() if node.get("Alive")]
        if blocks:
            return self._launch_blocks(job_overrides, initial_job_idx, options, nodes)
        for remote in options:
            if line := resources_refusal(asked_of(remote), nodes, "job"):
                cluster_jobs.refuse(line)
        refs = []
        for index, overrides, config, remote in zip(indices, job_overrides, configs, options, strict=True):
            log.info(f"\t#{index} : {' '.join(filter_overrides(overrides))}")
            refs.append(self._submit(remote, config, Singleton.get_state()))
        jobs = list(zip(refs, map(list, job_overrides), indices, strict=True))
        return cancelled_when_stopped(refs, lambda: said_as_they_end(refs, lambda k: [self._collect(*jobs[k])], "job"))

    def _submit(self, remote: dict, config: DictConfig, state: Any) -> Any:
        """One job as a Ray task (hydra-ray-launcher's), run with the launching environment's thread variables."""
        import ray
        from hydra_plugins.hydra_ray_launcher._launcher_util import _run_job

        task = ray.remote(**remote)(run_job_as_launched) if remote else ray.remote(run_job_as_launched)
        return task.remote(thread_variables(), _run_job, self.hydra_context, config, self.task_function, state)

    def _launch_blocks(
        self, job_overrides: Sequence[Sequence[str]], first: int, options: list[dict], nodes: list[dict]
    ) -> list[JobReturn]:
        """Each block a Ray task in a bundle of its own, the bundles on different nodes (STRICT_SPREAD), asking for
        what the most demanding job asks; a cluster with fewer nodes that can hold a block is refused before anything
        runs, and a placement group not placed within PLACEMENT_WAIT_S after."""
        import ray
        from hydra.core.singleton import Singleton
        from ray.util.placement_group import remove_placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        blocks = int(self.blocks or 1)
        if blocks > len(nodes):
            cluster_jobs.refuse(
                f"hydra.launcher.blocks={blocks} asks for {blocks} nodes, but the Ray cluster has {len(nodes)}"
            )
        asked = {"CPU": max(o.get("num_cpus", 1) for o in options), "GPU": max(o.get("num_gpus", 0) for o in options)}
        if line := resources_refusal(asked, nodes, "block", blocks):
            cluster_jobs.refuse(line)
        group = placed_group(asked, blocks)
        numbered = cluster_jobs.blocks_of(job_overrides, first, blocks)
        for number, overrides in (job for block in numbered for job in block):
            log.info(f"\t#{number} : {' '.join(filter_overrides(overrides))}")
        task = ray.remote(run_job_as_launched)
        refs = [
            task.options(
                num_cpus=asked["CPU"],
                num_gpus=asked["GPU"],
                max_retries=0,
                scheduling_strategy=PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=b),
            ).remote(
                thread_variables(),
                cluster_jobs.run_block,
                self.hydra_context,
                self.task_function,
                self.config,
                block,
                Singleton.get_state(),
            )
            for b, block in enumerate(numbered)
        ]
        try:
            return cancelled_when_stopped(
                refs, lambda: said_as_they_end(refs, lambda b: self._collect_block(refs[b], numbered[b]), "block")
            )
        finally:
            remove_placement_group(group)

    def _collect_block(self, ref: Any, numbered: cluster_jobs.Numbered) -> list[JobReturn]:
        """A block's jobs' returns; where its Ray task ended without them, each job recorded FAILED with why."""
        import ray

        try:
            return ray.get(ref)
        except ray.exceptions.RayError as error:
            return [self._failed(overrides, number, error) for number, overrides in numbered]

    def _job_sweep_config(self, overrides: list[str], index: int) -> DictConfig:
        config = self.hydra_context.config_loader.load_sweep_config(self.config, overrides)
        with open_dict(config):
            config.hydra.job.id = f"job_id_for_{index}"
            config.hydra.job.num = index
        return config

    def _remote(self, device: str, cluster_gpus: float) -> dict:
        return remote_options(self.ray_cfg.remote, device, self.gpus_per_cuda_job, cluster_gpus)

    def _collect(self, ref: Any, overrides: list[str], index: int) -> JobReturn:
        """The job's own return, or, where its Ray task ended without one, the FAILED record of it."""
        import ray

        try:
            return ray.get(ref)
        except ray.exceptions.RayError as error:
            return self._failed(overrides, index, error)

    def _failed(self, overrides: list[str], index: int, error: Exception) -> JobReturn:
        """A job whose Ray task ended without a result, recorded FAILED with Ray's reason."""
        run_dir, spec = cluster_jobs.job_config(self.hydra_context, self.config, overrides, index)
        reason = f"Ray task ended without a result ({type(error).__name__}: {first_line(error)})"
        cluster_jobs.record_ended(spec, run_dir, reason, {})  # its line, the reason in it: said_as_they_end
        failed = JobReturn(overrides=overrides, working_dir=str(run_dir), status=JobStatus.COMPLETED)
        failed.return_value = math.nan  # what run.py returns for a job that did not finish
        return failed


def init_options(init: DictConfig) -> DictConfig:
    """hydra.launcher.ray.init as ray.init takes it, with log_to_driver false unless it is set: the launching process
    says each job's line itself (said_as_they_end)."""
    options = OmegaConf.create(OmegaConf.to_container(init, resolve=True) if init else {})
    if "log_to_driver" not in options:
        options.log_to_driver = False
    return cast(DictConfig, options)


def said_as_they_end(refs: list[Any], collect: Callable[[int], list[JobReturn]], noun: str) -> list[JobReturn]:
    """collect(k), the JobReturns of task k, for each task of refs, in their order; each job's line said as its task
    ends (sweep_lines.say_job_line), and a progress line every PROGRESS_EVERY_S meanwhile. The lines are the launching
    process's own, once each, however many nodes forward a task's output."""
    import ray

    position = {ref: k for k, ref in enumerate(refs)}
    returns: dict[int, list[JobReturn]] = {}
    progress = Every(log)
    pending = list(refs)
    while pending:
        ended, pending = ray.wait(pending, num_returns=1, timeout=PROGRESS_EVERY_S)
        for ref in ended:
            returns[position[ref]] = collect(position[ref])
            for job in returns[position[ref]]:
                say_job_line(log, run_dir_of(job))
        if pending:
            left = time_left(progress.elapsed(), len(returns), len(refs))
            progress.say(f"{len(returns)} of {len(refs)} {noun}s ended, {progress.elapsed():.0f} s so far{left}")
    return [job for k in range(len(refs)) for job in returns[k]]


def run_dir_of(job: JobReturn) -> Path:
    """The job's run directory: its Hydra config's output_dir, where run_job gave it one, else its working_dir (the
    FAILED record of a task that ended without a result)."""
    if job.hydra_cfg is not None:
        return Path(str(job.hydra_cfg.hydra.runtime.output_dir))
    return Path(str(job.working_dir))


def remote_options(remote: DictConfig, device: str, gpus_per_cuda_job: float, cluster_gpus: float) -> dict:
    """The Ray task options of one job: the launcher's `remote`, plus GPUs for a cuda job. A cuda job on a
    cluster without a GPU could only wait: refused."""
    options = cast(dict[str, Any], OmegaConf.to_container(remote, resolve=True)) if remote else {}  # a DictConfig's
    if device == "cuda" and not cluster_gpus:
        cluster_jobs.refuse("device=cuda but the Ray cluster has no GPU (`ray status` lists its resources)")
    if device == "cuda":
        options.setdefault("num_gpus", gpus_per_cuda_job)
    return options


BLOCK_OPTIONS = ("num_cpus", "num_gpus", "max_retries")  # what a block's task takes of hydra.launcher.ray.remote


def unused_by_blocks(remote: DictConfig | dict | None) -> str | None:
    """Why the launcher's Ray task options cannot apply to blocks, in one line; None where they can. A block's task
    asks for its bundle's CPUs and GPUs only, and is never retried (it would time its rounds twice): Ray's other
    options (memory, resources, runtime_env, ...) were dropped without a word."""
    extra = sorted(str(key) for key in (remote or {}) if key not in BLOCK_OPTIONS)
    if not extra:
        return None
    named = ", ".join(f"hydra.launcher.ray.remote.{key}" for key in extra)
    return (
        f"{named} {'is' if len(extra) == 1 else 'are'} not applied to blocks (hydra.launcher.blocks): a block's Ray "
        "task asks for num_cpus and num_gpus only; give the workers' environment with "
        "hydra.launcher.ray.init.runtime_env, or launch a task per job (no blocks)"
    )


def asked_of(remote: dict) -> dict[str, float]:
    """A task's options as the resources it asks Ray for (a task asks for 1 CPU unless it says otherwise)."""
    return {"CPU": float(remote.get("num_cpus", 1)), "GPU": float(remote.get("num_gpus") or 0)}


def resources_refusal(asked: dict[str, float], nodes: list[dict], each: str, count: int = 1) -> str | None:
    """Why `count` tasks asking for `asked` each, on nodes of their own where count > 1, can never run on these nodes
    (ray.nodes(), alive), in one line; None where enough nodes can hold one. Ray would keep such a task waiting."""
    wanted = {k: v for k, v in asked.items() if v}
    holding = [n for n in nodes if all(n.get("Resources", {}).get(k, 0) >= v for k, v in wanted.items())]
    if len(holding) >= count:
        return None
    has = sorted({_resources(n.get("Resources", {}), wanted) for n in nodes}) or ["none"]
    where = f"{count} nodes" if count > 1 else "a node"
    return (
        f"hydra.launcher asks Ray for {_resources(asked, wanted)} per {each}, which {where} must hold, but "
        f"{len(holding)} of the Ray cluster's {len(nodes)} nodes can (each has {' or '.join(has)}, ray.nodes()): lower "
        "hydra.launcher.ray.remote.num_cpus (num_gpus, gpus_per_cuda_job)"
    )


def _resources(resources: dict, keys: dict) -> str:
    return ", ".join(f"{resources.get(k, 0):g} {k}{'s' * (resources.get(k, 0) != 1)}" for k in keys)


def placed_group(asked: dict[str, float], blocks: int) -> Any:
    """A placement group of `blocks` bundles of `asked`, on as many nodes (STRICT_SPREAD), placed; one not placed
    within PLACEMENT_WAIT_S (the nodes busy with other work) is removed and the sweep refused, saying what it asked and
    what the cluster has free."""
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group

    bundle = {k: v for k, v in asked.items() if v}
    group = placement_group([bundle] * blocks, strategy="STRICT_SPREAD")
    if group.wait(timeout_seconds=PLACEMENT_WAIT_S):
        return group
    remove_placement_group(group)
    free = ray.available_resources()
    cluster_jobs.refuse(
        f"Ray did not place {blocks} blocks of {_resources(asked, bundle)} each on {blocks} nodes (a STRICT_SPREAD "
        f"placement group) within {PLACEMENT_WAIT_S:.0f} s: the cluster has {_resources(free, bundle)} free in all "
        "(ray.available_resources())"
    )


def thread_variables() -> dict[str, str | None]:
    """The launching environment's thread variables (SPEED_VARIABLES), each value or None where unset."""
    return {name: os.environ.get(name) for name in SPEED_VARIABLES}


def run_job_as_launched(variables: dict[str, str | None], run: Any, *args: Any) -> Any:
    """In the Ray task: run(*args) with the thread variables the sweep was launched with, not Ray's (it sets
    OMP_NUM_THREADS to the task's num_cpus where unset): the run is the machine it runs on, as outside Ray. The task's
    Ray job id goes to the job's measuring worker (RAY_JOB_ID): the worker process's own may be none or nil."""
    environment.export_ray_job_id()
    for name, value in variables.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
    return run(*args)


def cancelled_when_stopped(refs: list[Any], collect: Any) -> Any:
    """collect(); where the launching process is stopped meanwhile (SIGTERM, Ctrl-C), the tasks are cancelled first,
    so that nothing of the sweep keeps running on the cluster."""
    import ray

    try:
        return collect()
    except BaseException:
        for ref in refs:
            ray.cancel(ref, force=True)
        raise

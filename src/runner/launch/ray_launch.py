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
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any, cast

from hydra.core.utils import JobReturn, JobStatus, filter_overrides
from hydra_plugins.hydra_ray_launcher.ray_launcher import RayLauncher as UpstreamRayLauncher
from omegaconf import DictConfig, OmegaConf, open_dict

from runner.config import first_line
from runner.launch import cluster_jobs

log = logging.getLogger(__name__)


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
        from hydra_plugins.hydra_ray_launcher._launcher_util import launch_job_on_ray, start_ray

        blocks = cluster_jobs.blocks_asked(self.blocks)  # before a Ray cluster is started for it
        setup_globals()
        configure_log(self.config.hydra.hydra_logging, self.config.hydra.verbose)
        Path(str(self.config.hydra.sweep.dir)).mkdir(parents=True, exist_ok=True)
        start_ray(self.ray_cfg.init)
        cluster_gpus = ray.cluster_resources().get("GPU", 0)
        indices = range(initial_job_idx, initial_job_idx + len(job_overrides))
        configs = [self._job_sweep_config(list(o), i) for o, i in zip(job_overrides, indices, strict=True)]
        # every job's options before any is submitted: a refused job leaves nothing running
        options = [self._remote(str(c.device.name), cluster_gpus) for c in configs]
        if blocks:
            return self._launch_blocks(job_overrides, initial_job_idx, options)
        refs = []
        for index, overrides, config, remote in zip(indices, job_overrides, configs, options, strict=True):
            log.info(f"\t#{index} : {' '.join(filter_overrides(overrides))}")
            state = Singleton.get_state()
            ray_options = OmegaConf.create(remote)
            refs.append(launch_job_on_ray(self.hydra_context, ray_options, config, self.task_function, state))
        return [self._collect(*job) for job in zip(refs, map(list, job_overrides), indices, strict=True)]

    def _launch_blocks(
        self, job_overrides: Sequence[Sequence[str]], first: int, options: list[dict]
    ) -> list[JobReturn]:
        """Each block a Ray task in a bundle of its own, the bundles on different nodes (STRICT_SPREAD), asking for
        what the most demanding job asks; a cluster with fewer nodes is refused before anything runs."""
        import ray
        from hydra.core.singleton import Singleton
        from ray.util.placement_group import placement_group, remove_placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        blocks = int(self.blocks or 1)
        nodes = sum(1 for node in ray.nodes() if node.get("Alive"))
        if blocks > nodes:
            cluster_jobs.refuse(
                f"hydra.launcher.blocks={blocks} asks for {blocks} nodes, but the Ray cluster has {nodes}"
            )
        asked = {"CPU": max(o.get("num_cpus", 1) for o in options), "GPU": max(o.get("num_gpus", 0) for o in options)}
        group = placement_group([{k: v for k, v in asked.items() if v}] * blocks, strategy="STRICT_SPREAD")
        numbered = cluster_jobs.blocks_of(job_overrides, first, blocks)
        for number, overrides in (job for block in numbered for job in block):
            log.info(f"\t#{number} : {' '.join(filter_overrides(overrides))}")
        task = ray.remote(cluster_jobs.run_block)
        refs = [
            task.options(
                num_cpus=asked["CPU"],
                num_gpus=asked["GPU"],
                max_retries=0,
                scheduling_strategy=PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=b),
            ).remote(self.hydra_context, self.task_function, self.config, block, Singleton.get_state())
            for b, block in enumerate(numbered)
        ]
        try:
            return [ret for ref, block in zip(refs, numbered, strict=True) for ret in self._collect_block(ref, block)]
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
        cluster_jobs.record_ended(spec, run_dir, reason, {})
        log.error(f"\t#{index} : {reason}")
        failed = JobReturn(overrides=overrides, working_dir=str(run_dir), status=JobStatus.COMPLETED)
        failed.return_value = math.nan  # what run.py returns for a job that did not finish
        return failed


def remote_options(remote: DictConfig, device: str, gpus_per_cuda_job: float, cluster_gpus: float) -> dict:
    """The Ray task options of one job: the launcher's `remote`, plus GPUs for a cuda job. A cuda job on a
    cluster without a GPU could only wait: refused."""
    options = cast(dict[str, Any], OmegaConf.to_container(remote, resolve=True)) if remote else {}  # a DictConfig's
    if device == "cuda" and not cluster_gpus:
        cluster_jobs.refuse("device=cuda but the Ray cluster has no GPU (`ray status` lists its resources)")
    if device == "cuda":
        options.setdefault("num_gpus", gpus_per_cuda_job)
    return options

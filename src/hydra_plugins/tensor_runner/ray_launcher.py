"""Hydra accepts launchers only from the `hydra_plugins` package: runner.launch.ray_launch's launcher, by that name,
and its config `hydra/launcher=tensor_runner_ray` (conf/hydra/launcher/ray_cluster.yaml builds on it).
Without the Ray extra (pip install -e '.[ray]') neither exists, and Hydra's plugin scan stays quiet."""

from dataclasses import dataclass, field
from typing import Any

try:
    from hydra_plugins.hydra_ray_launcher._config import RayConf

    from runner.launch import ray_launch

    RAY = True
except ImportError:
    RAY = False

if RAY:
    from hydra.core.config_store import ConfigStore

    class RayLauncher(ray_launch.RayLauncher):
        """hydra-ray-launcher's launcher, GPUs per cuda job, dead tasks recorded; see runner.launch.ray_launch."""

    @dataclass
    class RayClusterConf:
        _target_: str = "hydra_plugins.tensor_runner.ray_launcher.RayLauncher"
        ray: Any = field(default_factory=RayConf)
        gpus_per_cuda_job: float = 1  # GPUs a device=cuda job asks Ray for
        blocks: Any = None  # N: N nodes, each running every job of the sweep in interleaved rounds (int or None)

    ConfigStore.instance().store(group="hydra/launcher", name="tensor_runner_ray", node=RayClusterConf)

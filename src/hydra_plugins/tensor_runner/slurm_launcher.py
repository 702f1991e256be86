"""Hydra accepts launchers only from the `hydra_plugins` package: runner.launch.slurm's launcher, by that name, and
its config schema (`hydra/launcher=base_slurm`, which conf/hydra/launcher/slurm.yaml extends)."""

from hydra.core.config_store import ConfigStore

from runner.launch import slurm

ConfigStore.instance().store(group="hydra/launcher", name="base_slurm", node=slurm.SlurmConf, provider="tensor_runner")


class SlurmLauncher(slurm.SlurmLauncher):
    """submitit's SLURM launcher, a node per job, fitted to the partition; see runner.launch.slurm."""

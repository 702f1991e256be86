"""Hydra accepts launchers only from the `hydra_plugins` package: runner.slurm's launcher, by that name."""

from runner import slurm


class SlurmLauncher(slurm.SlurmLauncher):
    """submitit's SLURM launcher fitted to the partition; see runner.slurm."""

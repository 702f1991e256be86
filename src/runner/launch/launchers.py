"""Which launcher runs a sweep's jobs, and which sweeper picks them, as answers the rest asks for: one at a
time in this process (Hydra's basic launcher and sweeper), at once on this machine, or on other machines."""

from __future__ import annotations

from omegaconf import DictConfig

BASIC_LAUNCHER = "hydra._internal.core_plugins.basic_launcher.BasicLauncher"
BASIC_SWEEPER = "hydra._internal.core_plugins.basic_sweeper.BasicSweeper"


def one_at_a_time(launcher: DictConfig, sweeper: DictConfig) -> bool:
    """Jobs known before the first is measured (the basic sweeper: an optimizing one needs each job's time as
    its task returns), run one after the other by this process (the basic launcher)."""
    return str(launcher.get("_target_", "")) == BASIC_LAUNCHER and str(sweeper.get("_target_", "")) == BASIC_SWEEPER


def parallel_launcher(launcher: DictConfig) -> str | None:
    """A description of how jobs share this machine, or None when they run one at a time."""
    target = str(launcher.get("_target_", ""))
    n_jobs = launcher.get("n_jobs")
    if target.endswith(("JoblibLauncher", "ParallelLauncher")) and n_jobs != 1:
        at_once = "one job per core" if n_jobs == -1 else f"up to {n_jobs} jobs"
        return f"the joblib launcher runs {at_once} at once on this machine"
    if target.endswith("submitit_launcher.LocalLauncher"):
        return "submitit's local executor runs the jobs at once on this machine"
    return None


def cluster_launcher(launcher: DictConfig) -> bool:
    """Whether the jobs run on other machines (SLURM, Ray), which must reach the store and sweep directory."""
    return str(launcher.get("_target_", "")).endswith(("SlurmLauncher", "RayLauncher"))


class SweepRefused(SystemExit):
    """A launcher refuses the whole sweep before anything runs: exit 1, the reason in one line, which the app
    (runner.launch.sweep.callback.closed_when_stopped) records on the sweep and its end prints."""

    def __init__(self, line: str):
        super().__init__(1)
        self.line = line

"""Hydra accepts launchers only from the `hydra_plugins` package: the joblib launcher that
conf/hydra/launcher/parallel.yaml names, closing its sweep when it is stopped."""

from hydra_plugins.hydra_joblib_launcher.joblib_launcher import JoblibLauncher

from runner.launch.sweep import ClosesSweepWhenStopped


class ParallelLauncher(ClosesSweepWhenStopped, JoblibLauncher):
    """hydra-joblib-launcher's launcher: jobs at once on this machine, in joblib's worker processes."""

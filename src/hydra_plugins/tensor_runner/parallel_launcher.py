"""Hydra accepts launchers only from the `hydra_plugins` package: the joblib launcher that
conf/hydra/launcher/parallel.yaml names (a stopped sweep is closed by the app, runner.launch.sweep.callback)."""

from hydra_plugins.hydra_joblib_launcher.joblib_launcher import JoblibLauncher


class ParallelLauncher(JoblibLauncher):
    """hydra-joblib-launcher's launcher: jobs at once on this machine, in joblib's worker processes."""

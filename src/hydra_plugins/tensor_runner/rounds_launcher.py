"""Hydra accepts launchers only from the `hydra_plugins` package: runner.launch.local_launcher's launcher, by that
name, and its config `hydra/launcher=rounds` (conf/config.yaml makes it the default)."""

from dataclasses import dataclass

from hydra.core.config_store import ConfigStore

from runner.launch import local_launcher


class RoundsLauncher(local_launcher.RoundsLauncher):
    """A sweep's jobs one after the other on this machine, those that compare in interleaved rounds."""


@dataclass
class RoundsLauncherConf:
    _target_: str = "hydra_plugins.tensor_runner.rounds_launcher.RoundsLauncher"


ConfigStore.instance().store(group="hydra/launcher", name="rounds", node=RoundsLauncherConf, provider="tensor_runner")

"""A launcher added from outside src/ (PYTHONPATH=tests/plugin): this module and its config,
tests/plugin/conf/hydra/launcher/reverse.yaml. It runs a sweep's jobs last first, each through Hydra's run_job;
like every launcher, it does nothing to open or close the sweep (runner.launch.sweep.callback does)."""

from collections.abc import Sequence
from dataclasses import dataclass

from hydra.core.config_store import ConfigStore
from hydra.core.utils import JobReturn, run_job, setup_globals
from hydra.plugins.launcher import Launcher
from omegaconf import open_dict


@dataclass
class ReverseLauncherConf:
    _target_: str = "hydra_plugins.reverse_launcher.ReverseLauncher"


ConfigStore.instance().store(group="hydra/launcher", name="base_reverse", node=ReverseLauncherConf)


class ReverseLauncher(Launcher):
    def setup(self, *, hydra_context, task_function, config) -> None:
        self.hydra_context, self.task_function, self.config = hydra_context, task_function, config

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        setup_globals()
        returns = {}
        for number in reversed(range(initial_job_idx, initial_job_idx + len(job_overrides))):
            config = self.hydra_context.config_loader.load_sweep_config(
                self.config, list(job_overrides[number - initial_job_idx])
            )
            with open_dict(config):
                config.hydra.job.id = config.hydra.job.num = number
            returns[number] = run_job(
                self.task_function, config, "hydra.sweep.dir", "hydra.sweep.subdir", self.hydra_context
            )
        return [returns[number] for number in sorted(returns)]

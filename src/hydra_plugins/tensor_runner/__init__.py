"""tensor-runner's Hydra plugins. Hydra imports every module here when it scans for plugins, before it composes a
config: the schema conf/config.yaml names (`base_config`) is registered here, so that importing runner.config (as a
job's worker does) never imports Hydra."""

from runner.config import register_configs

register_configs()

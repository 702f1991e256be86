"""One run with the config preflight composed, as `hydra.main` runs it after composing its own.

`hydra.main` composes the whole config twice for one run: once to read `hydra.mode` (Hydra.get_mode), then the
run's (Hydra.run). Where preflight composed the command line as typed (preflight.Checked.as_given) its config is
that same config, so the run is started from it here with Hydra's own job runner (`run_job`, the launchers' API):
the same .hydra/ files, callbacks, logging, job return and error report, and no composition left (BENCHMARKS.md,
Start-up)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from hydra import version
from hydra._internal.callbacks import Callbacks
from hydra._internal.hydra import Hydra
from hydra._internal.utils import create_automatic_config_search_path, detect_task_name, run_and_report
from hydra.core.global_hydra import GlobalHydra
from hydra.core.utils import configure_log, run_job
from hydra.types import HydraContext, RunMode
from omegaconf import DictConfig, open_dict

CONFIG_NAME = "config"
VERSION_BASE = "1.3"


def runs_here(cfg: DictConfig) -> bool:
    """Whether the run's mode lets it start here: not where the config itself asks for a sweep (hydra.mode)."""
    return cfg.hydra.mode in (None, RunMode.RUN)


def run(cfg: DictConfig, task_function: Callable[[DictConfig], Any], config_path: str) -> None:
    """Run task_function on cfg (composed from the configs at config_path, a folder) as `hydra.main` would; a failed
    job is reported as Hydra reports it, with exit status 1."""
    version.setbase(VERSION_BASE)
    module = task_function.__module__
    task_name = detect_task_name(calling_file=None, calling_module=module)
    search_path = create_automatic_config_search_path(calling_file=None, calling_module=module, config_path=config_path)
    hydra = run_and_report(lambda: Hydra.create_main_hydra2(task_name=task_name, config_search_path=search_path))
    try:
        run_and_report(lambda: _run(hydra, _as_run(cfg), task_function))
    finally:
        GlobalHydra.instance().clear()


def _as_run(cfg: DictConfig) -> DictConfig:
    """What Hydra adds to a config it runs in RUN mode that did not ask for one (hydra._internal.utils._run_app)."""
    if cfg.hydra.mode is None:
        with open_dict(cfg.hydra):
            cfg.hydra.mode = RunMode.RUN
            cfg.hydra.overrides.hydra.append("hydra.mode=RUN")
    return cfg


def _run(hydra: Hydra, cfg: DictConfig, task_function: Callable[[DictConfig], Any]) -> None:
    """Hydra.run, after its composition."""
    configure_log(cfg.hydra.hydra_logging, cfg.hydra.verbose)
    callbacks = Callbacks(cfg)
    callbacks.on_run_start(config=cfg, config_name=CONFIG_NAME)
    ret = run_job(
        hydra_context=HydraContext(config_loader=hydra.config_loader, callbacks=callbacks),
        task_function=task_function,
        config=cfg,
        job_dir_key="hydra.run.dir",
        job_subdir_key=None,
    )
    callbacks.on_run_end(config=cfg, config_name=CONFIG_NAME, job_return=ret)
    _ = ret.return_value  # raises the job's exception, as Hydra.run does

"""The Hydra app: one run or a sweep of overrides, what `python run.py`, `tensor-runner` and `python -m runner run`
all run. Its configs are the checkout's conf/ from a source checkout, else those the wheel ships
(runner.locations)."""

from __future__ import annotations

import gc
import importlib.util
import signal
import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig

from runner.launch import isolation, preflight, rounds  # registers the structured configs and resolvers
from runner.launch.job_return import job_return
from runner.launch.sweep import lifecycle
from runner.launch.sweep.callback import closed_when_stopped
from runner.locations import CONFIG_PATH
from runner.measure.stop import SIGTERM, Stopped
from runner.record import environment


def main(cfg: DictConfig) -> float:
    """One job, run here (inline or in a worker process, as `isolation` says). Returns its median seconds per
    call (NaN where it did not finish), what Hydra's callbacks and sweepers see. In a sweep on this machine,
    the launcher (runner.launch.local_launcher) runs the jobs that compare in interleaved rounds instead."""
    hydra_cfg = HydraConfig.get()
    run_dir = Path(hydra_cfg.runtime.output_dir)
    multirun = hydra_cfg.mode == RunMode.MULTIRUN
    parent = lifecycle.parent_run_id(hydra_cfg.sweep.dir) if multirun else None
    environment.export_ray_job_id()
    alone = not multirun and rounds.wanted(cfg)  # a single run in rounds, as a sweep's jobs: it carries an interval
    result = rounds.measure_alone(cfg, run_dir) if alone else isolation.execute(cfg, run_dir, parent)
    return job_return(run_dir, result, multirun)


def cli(argv: list[str] | None = None, config_path: str = CONFIG_PATH) -> None:
    """Run Hydra on argv (default: the command line's arguments) with the configs at config_path (a folder, or
    pkg://PACKAGE); a sweep exits with its status (runner.launch.sweep.lifecycle.finish), a stopped run or sweep
    with 130."""
    if argv is not None:
        sys.argv = [sys.argv[0], *argv]  # Hydra reads its overrides and flags from sys.argv
    _plugins_listable()
    preflight.main()
    signal.signal(signal.SIGTERM, _stop)  # scancel, kill, a closing session: like Ctrl-C, record and stop
    app = hydra.main(version_base="1.3", config_path=config_path, config_name="config")(main)
    try:
        with closed_when_stopped():  # a sweep whose launch is stopped or refused is closed, whatever its launcher
            app()
    except KeyboardInterrupt:
        raise SystemExit(lifecycle.EXIT_INTERRUPTED) from None
    finally:
        # Exit without the garbage collector's passes over every module loaded (MLflow alone loads ~2,000),
        # most of the interpreter's teardown time. Files and the MLflow store are closed already; atexit still runs.
        gc.freeze()


def _plugins_listable() -> None:
    """Hydra finds its plugins (this package's launchers, whose configs `hydra/launcher=rounds` needs) by listing
    the folders on `hydra_plugins.__path__`. An editable install maps `hydra_plugins.tensor_runner` through an
    import hook that can import it but not list it: put the folder that holds it on that path."""
    import hydra_plugins

    spec = importlib.util.find_spec("hydra_plugins.tensor_runner")
    if spec is None or not spec.submodule_search_locations:
        return
    folder = str(Path(next(iter(spec.submodule_search_locations))).parent)
    if folder not in list(hydra_plugins.__path__):
        hydra_plugins.__path__.append(folder)


def _stop(signum: int, frame: object) -> None:
    raise Stopped(SIGTERM)

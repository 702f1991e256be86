"""The Hydra app: one run or a sweep of overrides, what `python run.py`, `tensor-runner` and `python -m runner run`
all run. Its configs are the checkout's conf/ from a source checkout, else those the wheel ships
(runner.locations)."""

from __future__ import annotations

import gc
import importlib.util
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from runner.locations import CONFIG_DIR, CONFIG_PATH
from runner.measure.stop import SIGTERM, Stopped

if TYPE_CHECKING:
    from omegaconf import DictConfig

    from runner.launch.preflight import Checked

# Imported where used, not here: `--help` is answered before Hydra starts (help_text), and what a job needs
# (launch/, Hydra) comes with cli(). A worker's process imports this module too (as a spawned process re-imports
# run.py), so each module-level import here is paid once more by every job.
HELP_FLAGS = ("--help", "-h")
MULTIRUN_FLAGS = ("-m", "--multirun")


def main(cfg: DictConfig) -> float:
    """One job, run here (inline or in a worker process, as `isolation` says). Returns its median seconds per
    call (NaN where it did not finish), what Hydra's callbacks and sweepers see. In a sweep on this machine,
    the launcher (runner.launch.local_launcher) runs the jobs that compare in interleaved rounds instead."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    from runner.launch import isolation, rounds
    from runner.launch.job_return import job_return
    from runner.launch.sweep import lifecycle
    from runner.record import environment
    from runner.record.naming import job_spec

    hydra_cfg = HydraConfig.get()
    run_dir = Path(hydra_cfg.runtime.output_dir)
    multirun = hydra_cfg.mode == RunMode.MULTIRUN
    parent = lifecycle.parent_run_id(hydra_cfg.sweep.dir) if multirun else None
    environment.export_ray_job_id()
    spec = job_spec(cfg)
    alone = not multirun and rounds.wanted(spec)  # a single run in rounds, as a sweep's jobs: it carries an interval
    result = rounds.measure_alone(spec, run_dir) if alone else isolation.execute(spec, run_dir, parent)
    return job_return(run_dir, result, multirun)


def cli(argv: list[str] | None = None, config_path: str = CONFIG_PATH) -> None:
    """Run Hydra on argv (default: the command line's arguments) with the configs at config_path (a folder, or
    pkg://PACKAGE); a sweep exits with its status (runner.launch.sweep.lifecycle.finish), a stopped run or sweep
    with 130."""
    if argv is not None:
        sys.argv = [sys.argv[0], *argv]  # Hydra reads its overrides and flags from sys.argv
    text = help_text(sys.argv[1:], config_path)
    if text is not None:
        print(text)
        return
    one_run = not any(arg.startswith("-") for arg in sys.argv[1:])  # overrides only: no sweep, no Hydra flag
    if one_run:
        from runner.launch.worker import start_spare_server

        start_spare_server(sys.argv[1:])  # the job's fork server starts while this process imports Hydra and composes
    import hydra
    from hydra.types import RunMode

    from runner.launch import isolation, preflight, single_run
    from runner.launch.sweep import lifecycle
    from runner.launch.sweep.callback import closed_when_stopped
    from runner.spec import environment_settings

    _plugins_listable()
    checked = preflight.main()
    if checked is not None and one_run and checked.cfg.hydra.mode != RunMode.MULTIRUN:
        cfg = checked.cfg  # or hands the spare its backend:
        settings = environment_settings(cfg.environment)
        isolation.start_server(str(cfg.isolation), bool(cfg.timing.fixed_layout), str(cfg.backend.module), settings)
    signal.signal(signal.SIGTERM, _stop)  # scancel, kill, a closing session: like Ctrl-C, record and stop
    app = hydra.main(version_base="1.3", config_path=config_path, config_name="config")(main)
    composed = _run_config(checked, config_path)
    try:
        with closed_when_stopped():  # a sweep whose launch is stopped or refused is closed, whatever its launcher
            if composed is not None:
                single_run.run(composed, main, config_path)
            else:
                app()
    except KeyboardInterrupt:
        raise SystemExit(lifecycle.EXIT_INTERRUPTED) from None
    finally:
        # Exit without the garbage collector's passes over every module loaded (MLflow alone loads ~2,000),
        # most of the interpreter's teardown time. Files and the MLflow store are closed already; atexit still runs.
        gc.freeze()


def _run_config(checked: Checked | None, config_path: str) -> DictConfig | None:
    """preflight's config where it is the one Hydra would compose to run: the command line as typed (one run, no
    Hydra setting left out), this app's own configs, and no sweep asked for by the config (hydra.mode)."""
    from runner.launch import single_run

    if checked is None or not checked.as_given or config_path != str(CONFIG_DIR):
        return None
    return checked.cfg if single_run.runs_here(checked.cfg) else None


def help_text(argv: list[str], config_path: str = CONFIG_PATH) -> str | None:
    """What `--help` prints, rendered from the app's help template (hydra/help, chosen in config.yaml) without
    starting Hydra: Hydra's own `--help` composes the whole config and lists every option of every group (the ~40
    variants too) for its $APP_CONFIG_GROUPS and $HYDRA_CONFIG_GROUPS, whether the template shows them or not.
    None where Hydra must answer: no --help, other arguments beside it (overrides, --config-name, ...), configs that
    are not this app's folder, or a template that shows what only Hydra knows ($CONFIG, $FLAGS_HELP, the groups)."""
    if not any(arg in HELP_FLAGS for arg in argv) or not all(arg in (*HELP_FLAGS, *MULTIRUN_FLAGS) for arg in argv):
        return None
    config_dir = CONFIG_DIR if config_path == CONFIG_PATH else Path(config_path)
    if not (config_dir / "config.yaml").is_file():
        return None
    from omegaconf import DictConfig, OmegaConf

    config = OmegaConf.load(config_dir / "config.yaml")
    if not isinstance(config, DictConfig):
        return None
    defaults = [d for d in config.get("defaults", []) if not isinstance(d, str)]
    chosen = [d["override hydra/help"] for d in defaults if "override hydra/help" in d]
    template_file = config_dir / "hydra" / "help" / f"{chosen[-1] if chosen else ''}.yaml"
    if not template_file.is_file():
        return None  # Hydra's default help, which shows the config: Hydra's
    settings = OmegaConf.merge(OmegaConf.load(template_file), config.get("hydra", {}).get("help", {}))
    try:
        text = str(OmegaConf.create({"hydra": {"help": settings}}).hydra.help.template)
    except Exception:  # an interpolation of something else than hydra.help: Hydra resolves it
        return None
    return None if "$" in text else text


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

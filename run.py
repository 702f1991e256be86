#!/usr/bin/env python
"""tensor-runner entry point.

python run.py [overrides]          one run, e.g. backend=torch model=mlp task=gradients
python run.py -m [sweeps]          a sweep, e.g. backend=torch,tensorflow mode=eager,function
python run.py +experiment=NAME     a ready-made experiment from experiments/
"""

from __future__ import annotations

import gc
import signal
import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

sys.path.insert(0, str(Path(__file__).resolve().parent / "src"))  # works before `pip install -e .` too

from runner.launch import isolation, preflight, sweep  # noqa: E402  (registers the structured configs and resolvers)
from runner.launch.job_return import job_return  # noqa: E402
from runner.measure.stop import SIGTERM, Stopped  # noqa: E402
from runner.record import environment  # noqa: E402


@hydra.main(version_base="1.3", config_path="conf", config_name="config")
def main(cfg: DictConfig) -> float:
    """One job, run here (inline or in a worker process, as `isolation` says). Returns its median seconds per
    call (NaN where it did not finish), what Hydra's callbacks and sweepers see. In a sweep on this machine,
    the launcher (runner.launch.local_launcher) runs the jobs that compare in interleaved rounds instead."""
    hydra_cfg = HydraConfig.get()
    run_dir = Path(hydra_cfg.runtime.output_dir)
    multirun = hydra_cfg.mode.name == "MULTIRUN"
    parent = sweep.parent_run_id(hydra_cfg.sweep.dir) if multirun else None
    environment.export_ray_job_id()
    return job_return(run_dir, isolation.execute(cfg, run_dir, parent), multirun)


def cli() -> None:
    """Run Hydra; a sweep exits with its status (runner.launch.sweep.finish), a stopped run or sweep with 130."""
    preflight.main()
    signal.signal(signal.SIGTERM, _stop)  # scancel, kill, a closing session: like Ctrl-C, record and stop
    try:
        main()
    except KeyboardInterrupt:
        raise SystemExit(sweep.EXIT_INTERRUPTED) from None
    finally:
        # Exit without the garbage collector's passes over every module loaded (MLflow alone loads ~2,000),
        # most of the interpreter's teardown time. Files and the MLflow store are closed already; atexit still runs.
        gc.freeze()


def _stop(signum, frame) -> None:
    raise Stopped(SIGTERM)


if __name__ == "__main__":
    cli()

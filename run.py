#!/usr/bin/env python
"""tensor-runner entry point.

python run.py [overrides]          one run, e.g. backend=torch model=mlp task=gradients
python run.py -m [sweeps]          a sweep, e.g. backend=torch,tensorflow mode=eager,function
python run.py +experiment=NAME     a ready-made experiment from experiments/
"""

from __future__ import annotations

import gc
import math
import signal
import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

sys.path.insert(0, str(Path(__file__).resolve().parent / "src"))  # works before `pip install -e .` too

from runner.launch import isolation, preflight, rounds, sweep  # noqa: E402  (registers the structured configs and resolvers)
from runner.launch.terminal import print_summary  # noqa: E402
from runner.measure.job import CTRL_C, SIGTERM, Stopped, stop_reason  # noqa: E402
from runner.record import environment


@hydra.main(version_base="1.3", config_path="conf", config_name="config")
def main(cfg: DictConfig) -> float | None:
    """One job. Returns its median seconds per call (NaN where it did not finish), what Hydra's callbacks
    and sweepers see; None for a job of interleaved rounds, measured after every job's task has returned."""
    hydra_cfg = HydraConfig.get()
    run_dir = Path(hydra_cfg.runtime.output_dir)
    multirun = hydra_cfg.mode.name == "MULTIRUN"
    parent = sweep.parent_run_id(hydra_cfg.sweep.dir) if multirun else None
    environment.export_ray_job_id()
    active = sweep.active()
    if active is not None and rounds.wanted(cfg, multirun, hydra_cfg.launcher, hydra_cfg.sweeper):
        outcome = active.coordinator.set_up(cfg, run_dir, parent, on_done=print_summary)
        if outcome is None:
            return None  # set up: measured in interleaved rounds once every job is (sweep.finish)
    else:
        outcome = isolation.execute(cfg, run_dir, parent)
    print_summary(cfg, run_dir, outcome)
    if outcome.status == "KILLED":  # Ctrl-C or SIGTERM: stop here, the sweep too
        raise Stopped(outcome.error or CTRL_C)
    if outcome.status != "FINISHED" and not multirun:
        raise SystemExit(1)
    # a sweep goes on after a failed job (an optimizing sweeper takes NaN for a failed trial); its exit code
    # comes from sweep.finish
    return outcome.metrics.get("time_median_s", math.nan) if outcome.status == "FINISHED" else math.nan


def cli() -> None:
    """Run Hydra, then close a sweep whatever happened to its jobs, and exit with its status."""
    preflight.main()
    signal.signal(signal.SIGTERM, _stop)  # scancel, kill, a closing session: like Ctrl-C, record and stop
    interrupted = None  # what stopped the run, if anything did
    try:
        main()
    except KeyboardInterrupt as stop:
        interrupted = stop_reason(stop)
    finally:
        code = sweep.finish(interrupted=interrupted)
        # Exit without the garbage collector's passes over every module loaded (MLflow alone loads ~2,000),
        # most of the interpreter's teardown time. Files and the MLflow store are closed already; atexit still runs.
        gc.freeze()
    if interrupted:
        raise SystemExit(sweep.EXIT_INTERRUPTED)
    if code:
        raise SystemExit(code)


def _stop(signum, frame) -> None:
    raise Stopped(SIGTERM)


if __name__ == "__main__":
    cli()

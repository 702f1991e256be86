"""What a job gives Hydra once it has ended, however it ran: what it says on the terminal (its summary in a
single run, one line in a sweep), and the value its task returns, what Hydra's callbacks and sweepers see."""

from __future__ import annotations

import logging
import math
from pathlib import Path

from runner.launch.sweep_lines import job_line
from runner.launch.terminal import print_summary
from runner.measure.stop import SIGTERM, Stopped
from runner.record.result import Result, Status

log = logging.getLogger(__name__)


def job_return(run_dir: Path, outcome: Result, multirun: bool) -> float:
    """The job's median seconds per call; NaN where it did not finish (an optimizing sweeper takes NaN for a
    failed trial, and the sweep goes on). A job stopped by Ctrl-C or SIGTERM stops the sweep too; a single
    run that failed exits 1. A single run prints its summary; a sweep's job logs one line (its numbers are in
    the sweep's table, its warnings under it)."""
    if multirun:
        log.log(logging.INFO if outcome.status == Status.FINISHED else logging.WARNING, job_line(run_dir, outcome))
    else:
        print_summary(run_dir, outcome)
    if outcome.status == Status.KILLED:
        raise Stopped(outcome.stopped_by or SIGTERM)  # without one: a signal sent to its worker alone
    if outcome.status != Status.FINISHED and not multirun:
        raise SystemExit(1)
    return outcome.metrics.get("time_median_s", math.nan) if outcome.status == Status.FINISHED else math.nan

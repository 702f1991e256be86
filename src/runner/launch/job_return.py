"""What a job gives Hydra once it has ended, however it ran: its summary on the terminal, and the value its
task returns, what Hydra's callbacks and sweepers see."""

from __future__ import annotations

import math
from pathlib import Path

from runner.launch.terminal import print_summary
from runner.measure.stop import SIGTERM, Stopped
from runner.record.result import Result, Status


def job_return(run_dir: Path, outcome: Result, multirun: bool) -> float:
    """The job's median seconds per call; NaN where it did not finish (an optimizing sweeper takes NaN for a
    failed trial, and the sweep goes on). A job stopped by Ctrl-C or SIGTERM stops the sweep too; a single
    run that failed exits 1."""
    print_summary(run_dir, outcome)
    if outcome.status == Status.KILLED:
        raise Stopped(outcome.stopped_by or SIGTERM)  # without one: a signal sent to its worker alone
    if outcome.status != Status.FINISHED and not multirun:
        raise SystemExit(1)
    return outcome.metrics.get("time_median_s", math.nan) if outcome.status == Status.FINISHED else math.nan

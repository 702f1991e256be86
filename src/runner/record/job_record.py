"""Writing a job's record, whatever ended it: the job itself (`write`), the launcher adding the tail of a
job's output to a record that did not finish (`add_output_tail`), and a cluster that ended the job
(`ended_by_cluster`). Nothing else writes a job's result.json."""

from __future__ import annotations

import time
from collections import deque
from pathlib import Path

from runner.record.result import ERROR_LOG, LOG_FILE, Result, Status
from runner.spec import JobSpec

TAIL_LINES = 40


def write(spec: JobSpec, run_dir: Path, result: Result) -> None:
    """Write the run directory: the resolved config (and which of its keys copy another) goes into
    result.json, the choices into tensors.h5."""
    result.config = spec.config
    result.copied_keys = spec.copied_keys
    result.ended = result.ended or time.time()
    result.attrs = {**spec.choices(), **result.attrs}
    result.write(run_dir)


def add_output_tail(run_dir: Path, result: Result) -> Result:
    """Put the last lines of the job's output (or its traceback) into its result.json."""
    for name in (LOG_FILE, ERROR_LOG):
        path = Path(run_dir) / name
        if path.exists() and path.stat().st_size:
            with path.open(errors="replace") as f:
                result.output_tail = "".join(deque(f, maxlen=TAIL_LINES))
            result.save(run_dir)
            break
    return result


def ended_by_cluster(spec: JobSpec, run_dir: Path, reason: str, context: dict[str, str]) -> bool:
    """A job the cluster ended is FAILED with the cluster's `reason` (and `context`: its job id); a job that
    recorded itself keeps its record, with the reason put first. Returns whether the record changed:
    recording the same reason twice changes nothing."""
    run_dir.mkdir(parents=True, exist_ok=True)  # a job that never started has no directory yet
    if not Result.exists(run_dir):
        write(spec, run_dir, Result(status=Status.FAILED, error=reason, environment=context))
        return True
    result = Result.load(run_dir)
    if (result.error or "").startswith(reason):
        return False
    result.status, result.error = Status.FAILED, f"{reason}; {result.error}" if result.error else reason
    result.environment = {**context, **result.environment}
    result.save(run_dir)
    return True

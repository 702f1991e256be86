"""Following submitted SLURM jobs with squeue (which works without accounting): one line per change of
state, jobs pending for a reason waiting cannot resolve cancelled, submitit's sacct warning shown once."""

from __future__ import annotations

import logging
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Any

PENDING_GRACE_S = 30.0  # how long a job may pend for a permanent reason before it is cancelled
# Pending reasons that waiting cannot resolve (squeue's %r; ReqNodeNotAvail comes with the node list).
PERMANENT_REASONS = (
    "PartitionConfig",
    "PartitionDown",
    "PartitionInactive",
    "PartitionNodeLimit",
    "PartitionTimeLimit",
    "ReqNodeNotAvail",
    "BadConstraints",
    "InvalidAccount",
    "InvalidQOS",
    "DependencyNeverSatisfied",
)
ENDED = {"COMPLETED", "FAILED", "TIMEOUT", "CANCELLED", "OUT_OF_MEMORY", "NODE_FAIL", "PREEMPTED", "BOOT_FAIL"}
ENDED |= {"DEADLINE", "UNKNOWN_END"}  # UNKNOWN_END: ours, for a job squeue stopped listing before we saw its end
POLL_MIN_S, POLL_MAX_S = 1.0, 15.0


@dataclass
class JobState:
    job_id: str  # submitit's id: ARRAYID_TASK
    state: str = "SUBMITTED"
    reason: str = ""
    slurm_job_id: str = ""  # the array task's own job id (SLURM_JOB_ID in the job)
    extra: str = ""  # what we did about it (a cancel), for the record
    node: str = ""  # the node it runs or ran on (squeue's %N), once it has one

    @property
    def placed_on(self) -> str:
        """The node it runs or ran on; '' while it is pending."""
        return self.node if self.state != "PENDING" else ""

    def describe(self) -> str:
        reason = f" ({self.reason})" if self.reason and self.reason != "None" else ""
        on = f" on {self.placed_on}" if self.placed_on else ""
        return f"SLURM job {self.job_id} {self.state}{reason}{on}{self.extra}"


def read_queue(array_ids: set[str]) -> dict[str, JobState] | None:
    """The jobs' states (ended ones too, while SLURM still lists them); None when squeue fails."""
    out = subprocess.run(
        ["squeue", "-h", "-r", "--states=all", "-j", ",".join(sorted(array_ids)), "-o", "%i|%A|%T|%r|%N"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    if out.returncode != 0:
        return None
    return parse_queue(out.stdout)


def parse_queue(text: str) -> dict[str, JobState]:
    states = {}
    for line in text.splitlines():
        parts = line.strip().split("|")
        if len(parts) in (4, 5):
            states[parts[0]] = JobState(parts[0], parts[2], parts[3], parts[1], node=(parts[4:] or [""])[0])
    return states


def lost_nodes(nodes: set[str]) -> dict[str, str]:
    """Of these nodes, those SLURM has lost (lost_in), each as sinfo says it; empty where sinfo cannot answer."""
    if not nodes:
        return {}
    out = subprocess.run(
        ["sinfo", "-h", "-N", "-n", ",".join(sorted(nodes)), "-o", "%N|%t|%E"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    return lost_in(out.stdout) if out.returncode == 0 else {}


def lost_in(text: str) -> dict[str, str]:
    """The nodes of sinfo's lines (%N|%t|%E) that SLURM has lost, each as 'node-2 down* (Not responding)': down, or
    not answering slurmctld's pings (a `*` after its state, set about SlurmdTimeout/3 after the node went quiet, before
    SLURM sets it down at SlurmdTimeout). A drained node still runs its jobs."""
    lost = {}
    for line in text.splitlines():
        name, state, reason = (line.strip().split("|", 2) + ["", ""])[:3]
        if state.startswith("down") or "*" in state:
            lost[name] = f"{name} {state}" + (f" ({reason})" if reason and reason != "none" else "")
    return lost


def is_permanent(state: JobState) -> bool:
    return state.state == "PENDING" and state.reason.startswith(PERMANENT_REASONS)


@dataclass
class Follower:
    """Follows submitted jobs to their end, one line per change, cancelling jobs that can never start."""

    jobs: list[Any]  # submitit jobs, in the sweep's order
    first: int = 0  # the first job's number in the sweep
    noun: str = "job #"  # what a line calls each: 'job #3', 'block 2' (hydra.launcher.blocks)
    states: dict[str, JobState] = field(default_factory=dict)
    pending_since: dict[str, float] = field(default_factory=dict)
    missing: dict[str, int] = field(default_factory=dict)
    queue_failed: bool = False

    def run(self) -> dict[str, JobState]:
        """Each job's end state; on Ctrl-C or SIGTERM, the jobs still queued or running are cancelled first, so that
        nothing of the sweep keeps running on the cluster."""
        start = time.monotonic()
        self.states = {job.job_id: JobState(job.job_id) for job in self.jobs}
        try:
            while not all(s.state in ENDED for s in self.states.values()):
                self.poll()
                if not all(s.state in ENDED for s in self.states.values()):
                    time.sleep(min(POLL_MAX_S, POLL_MIN_S + (time.monotonic() - start) / 10))
        except BaseException:
            self.cancel_all()
            raise
        return self.states

    def poll(self) -> None:
        queue = read_queue({job.job_id.split("_")[0] for job in self.jobs})
        if queue is None and not self.queue_failed:
            print("slurm: squeue failed; still waiting for the jobs' results", file=sys.stderr, flush=True)
        self.queue_failed = queue is None
        for index, job in enumerate(self.jobs):
            if self.states[job.job_id].state not in ENDED:
                self.update(index, job, _find(queue or {}, job.job_id), listed=queue is not None)
        self.end_lost()

    def end_lost(self) -> None:
        """Cancel the jobs whose node SLURM has lost (lost_nodes), each ended NODE_FAIL with what sinfo says of its
        node: SLURM would end or requeue them only at SlurmdTimeout, and a job whose node died mid-run can sit in
        COMPLETING for minutes."""
        running = {i: s for i, s in enumerate(self.states.values()) if s.state not in ENDED and s.state != "PENDING"}
        lost = lost_nodes({state.node for state in running.values() if state.node})
        for index, state in running.items():
            if state.node in lost:
                subprocess.run(["scancel", state.job_id], capture_output=True, timeout=60)
                ended = JobState(state.job_id, "NODE_FAIL", f"sinfo: {lost[state.node]}", state.slurm_job_id)
                ended.node, ended.extra = state.node, ": its node is lost; cancelled"
                print(f"slurm: {self.noun}{self.first + index} {ended.describe()}", flush=True)
                self.states[state.job_id] = ended

    def update(self, index: int, job: Any, seen: JobState | None, listed: bool = True) -> None:
        old = self.states[job.job_id]
        if seen is None:
            seen = self.vanished(job, old, listed)
        seen.extra = old.extra
        seen.node = seen.node or old.node
        if not is_permanent(seen):
            self.pending_since.pop(job.job_id, None)
        if is_permanent(seen) and not seen.extra and self.pending_too_long(job.job_id):
            subprocess.run(["scancel", job.job_id], capture_output=True, timeout=60)
            seen.extra = (
                f": pending for {seen.reason}, which waiting cannot resolve; cancelled after {PENDING_GRACE_S:.0f} s"
            )
        if (seen.state, seen.reason, seen.extra) != (old.state, old.reason, old.extra):
            print(f"slurm: {self.noun}{self.first + index} {seen.describe()}{_hint(seen)}", flush=True)
        self.states[job.job_id] = seen

    def vanished(self, job: Any, old: JobState, listed: bool) -> JobState:
        """A job squeue does not list: not yet (just submitted), purged after it ended, or squeue failed."""
        self.missing[job.job_id] = self.missing.get(job.job_id, 0) + listed
        if job.paths.result_pickle.exists() or (old.state != "SUBMITTED" and self.missing[job.job_id] >= 3):
            state = "COMPLETED" if job.paths.result_pickle.exists() else "UNKNOWN_END"
            return JobState(job.job_id, state, "no longer listed by squeue", old.slurm_job_id)
        return JobState(job.job_id, old.state, old.reason, old.slurm_job_id)

    def pending_too_long(self, job_id: str) -> bool:
        since = self.pending_since.setdefault(job_id, time.monotonic())
        return time.monotonic() - since >= PENDING_GRACE_S

    def cancel_all(self) -> None:
        ids = [job_id for job_id, state in self.states.items() if state.state not in ENDED]
        if ids:
            subprocess.run(["scancel", *ids], capture_output=True, timeout=60)


def _find(queue: dict[str, JobState], job_id: str) -> JobState | None:
    """The job's line; for a task of an array never split (cancelled while pending), the array's line."""
    found = queue.get(job_id)
    array = queue.get(job_id.split("_")[0])
    if found is None and array is not None:
        found = JobState(job_id, array.state, array.reason, array.slurm_job_id)
    return found


def _hint(state: JobState) -> str:
    if state.state != "PENDING" or state.extra:
        return ""
    if is_permanent(state):
        return f": it cannot start as asked; cancelled after {PENDING_GRACE_S:.0f} s unless SLURM starts it"
    return ": queued"


class _OnceSacctFilter(logging.Filter):
    """Lets submitit's sacct fallback warning through once, saying what it means; drops the repeats."""

    def __init__(self) -> None:
        super().__init__()
        self.shown = False

    def filter(self, record: logging.LogRecord) -> bool:
        if "Bypassing sacct error" not in record.getMessage():
            return True
        if self.shown:
            return False
        self.shown = True
        record.msg = (
            "submitit cannot read SLURM accounting (sacct failed: accounting storage is probably disabled); "
            "job states come from squeue instead, and this is not repeated"
        )
        record.args = ()
        return True


_SACCT_FILTER = _OnceSacctFilter()


def quiet_sacct_warnings() -> None:
    logger = logging.getLogger("submitit")
    if _SACCT_FILTER not in logger.filters:
        logger.addFilter(_SACCT_FILTER)

"""SLURM sweeps that fit the cluster they are sent to (`hydra/launcher=slurm`, submitit underneath).

`SlurmLauncher` is hydra-submitit-launcher's, changed where a real cluster showed it wanting:
- Before anything is submitted it reads the partition with `sinfo`. `cpus_per_task` / `mem_gb` left null
  are taken from the partition's smallest node (a whole node per job, so jobs never share cores while
  they time); a request no node of the partition can hold is refused with one line, the sweep exits 1
  and its parent run is FAILED.
- It follows the jobs with `squeue` (which works without SLURM accounting) rather than submitit's `sacct`
  polling, and prints a line only when a job changes state: queued and why, running, ended.
- A job pending for a reason that waiting cannot resolve (`PERMANENT_REASONS`: the partition cannot
  ever give it what it asks, is down, ...) is cancelled after `PENDING_GRACE_S`; `Resources`, `Priority`
  and other reasons just wait.
- A job SLURM ends (its time limit, a cancel, a node failure, out of memory) is recorded FAILED with
  SLURM's state and reason, in result.json and in MLflow; the other jobs of the sweep are untouched.
- submitit's "Bypassing sacct error" warning, should submitit still call sacct, is shown once with what
  it means.
"""

from __future__ import annotations

import logging
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hydra.core.singleton import Singleton
from hydra.core.utils import JobReturn, JobStatus
from hydra_plugins.hydra_submitit_launcher.submitit_launcher import SlurmLauncher as SubmititSlurmLauncher
from omegaconf import DictConfig, OmegaConf

from runner import cluster_jobs
from runner.config import first_line

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


class LaunchRefused(Exception):
    """One line: why no job of the sweep was submitted."""


@dataclass(frozen=True)
class Node:
    name: str
    cpus: int
    memory_mb: int
    gpus: int

    def describe(self) -> str:
        gpus = f", {self.gpus} GPUs" if self.gpus else ""
        return f"{self.cpus} CPUs, {self.memory_mb / 1024:.1f} GB{gpus}"


@dataclass(frozen=True)
class Partition:
    name: str
    available: str
    nodes: tuple[Node, ...]
    max_time_min: int | None = None  # None: no limit


@dataclass
class JobState:
    job_id: str  # submitit's id: ARRAYID_TASK
    state: str = "SUBMITTED"
    reason: str = ""
    slurm_job_id: str = ""  # the array task's own job id (SLURM_JOB_ID in the job)
    extra: str = ""  # what we did about it (a cancel), for the record

    def describe(self) -> str:
        reason = f" ({self.reason})" if self.reason and self.reason != "None" else ""
        return f"SLURM job {self.job_id} {self.state}{reason}{self.extra}"


# ---------------------------------------------------------------------------------------------- sinfo


def read_partition(name: str | None) -> Partition:
    """The partition's nodes as `sinfo` lists them (the default partition when name is None)."""
    if shutil.which("sinfo") is None:
        raise LaunchRefused("hydra/launcher=slurm needs SLURM's commands, and sinfo is not on PATH")
    out = subprocess.run(
        ["sinfo", "-h", "-N", "-o", "%P|%a|%N|%c|%m|%G|%l"], capture_output=True, text=True, timeout=30
    )
    if out.returncode != 0:
        raise LaunchRefused(f"sinfo failed: {(out.stderr.strip().splitlines() or [out.returncode])[0]}")
    return parse_sinfo(out.stdout, name)


def parse_sinfo(text: str, name: str | None) -> Partition:
    rows = [line.split("|") for line in text.splitlines() if line.count("|") == 6]
    names = sorted({row[0].rstrip("*") for row in rows})
    if name is None:
        defaults = [row[0].rstrip("*") for row in rows if row[0].endswith("*")]
        if not defaults:
            raise LaunchRefused(f"no default SLURM partition: set hydra.launcher.partition (one of {names})")
        name = defaults[0]
    mine = [row for row in rows if row[0].rstrip("*") == name]
    if not mine:
        raise LaunchRefused(f"SLURM has no partition {name!r} (sinfo lists {', '.join(names) or 'none'})")
    nodes = {row[2]: Node(row[2], int(row[3].rstrip("+")), int(row[4].rstrip("+")), _gpus(row[5])) for row in mine}
    return Partition(name, mine[0][1], tuple(nodes.values()), _minutes(mine[0][6]))


def _minutes(limit: str) -> int | None:
    """sinfo's time limit in whole minutes (None: infinite). Forms: M, M:S, H:M:S, D-H, D-H:M, D-H:M:S."""
    match = re.fullmatch(r"(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?", limit)
    if not match:
        return None
    days, *clock = match.groups()
    numbers = [int(x) for x in clock if x is not None]
    if days is not None or len(numbers) == 3:
        hours, minutes, seconds = (numbers + [0, 0])[:3]
    else:
        hours, (minutes, seconds) = 0, (numbers + [0])[:2]
    return int(days or 0) * 1440 + hours * 60 + minutes + (seconds > 0)


def _gpus(gres: str) -> int:
    return sum(int(count) for count in re.findall(r"gpu(?::[^:,(]+)?:(\d+)", gres))


def fit_request(params: dict[str, Any], partition: Partition) -> dict[str, Any]:
    """params with null cpus/memory filled from the partition; LaunchRefused if no node can hold it."""
    if partition.available != "up":
        raise LaunchRefused(f"SLURM partition {partition.name} is {partition.available} (sinfo): no job can start")
    params = dict(params)
    smallest = min(partition.nodes, key=lambda node: (node.cpus, node.memory_mb))
    tasks = params.get("tasks_per_node") or 1
    if params.get("cpus_per_task") is None:
        params["cpus_per_task"] = max(1, smallest.cpus // tasks)
    if params.get("mem_gb") is None and not (params.get("mem_per_cpu") or params.get("mem_per_gpu")):
        share = params["cpus_per_task"] * tasks / smallest.cpus  # memory in proportion to the cores taken
        params["mem_gb"] = max(1, int(smallest.memory_mb * min(share, 1.0)) // 1024)
    check_fits(params, partition)
    limit = partition.max_time_min
    if limit is not None and params.get("timeout_min", 0) > limit:
        raise LaunchRefused(
            f"hydra.launcher.timeout_min={params['timeout_min']} is longer than partition {partition.name} allows "
            f"({limit} min, sinfo): lower timeout_min"
        )
    return params


def check_fits(params: dict[str, Any], partition: Partition) -> None:
    want = Node(
        "request",
        (params.get("cpus_per_task") or 1) * (params.get("tasks_per_node") or 1),
        int((params.get("mem_gb") or 0) * 1024),
        params.get("gpus_per_node") or (params.get("gpus_per_task") or 0) * (params.get("tasks_per_node") or 1),
    )
    fitting = [
        n for n in partition.nodes if n.cpus >= want.cpus and n.memory_mb >= want.memory_mb and n.gpus >= want.gpus
    ]
    nodes = params.get("nodes") or 1
    if len(fitting) >= nodes:
        return
    largest = max(partition.nodes, key=lambda node: (node.cpus, node.memory_mb, node.gpus))
    count = f"{nodes} nodes with " if nodes > 1 else ""
    raise LaunchRefused(
        f"hydra.launcher asks for {count}{want.describe()} per node, but partition {partition.name} has "
        f"{len(fitting)} such nodes (its largest: {largest.describe()}, sinfo): lower cpus_per_task / mem_gb / "
        "gpus_per_node, or leave cpus_per_task and mem_gb null to fit the partition"
    )


# --------------------------------------------------------------------------------------------- squeue


def read_queue(array_ids: set[str]) -> dict[str, JobState] | None:
    """The jobs' states (ended ones too, while SLURM still lists them); None when squeue fails."""
    out = subprocess.run(
        ["squeue", "-h", "-r", "--states=all", "-j", ",".join(sorted(array_ids)), "-o", "%i|%A|%T|%r"],
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
        if len(parts) == 4:
            states[parts[0]] = JobState(parts[0], parts[2], parts[3], parts[1])
    return states


def is_permanent(state: JobState) -> bool:
    return state.state == "PENDING" and state.reason.startswith(PERMANENT_REASONS)


@dataclass
class Follower:
    """Follows submitted jobs to their end, one line per change, cancelling jobs that can never start."""

    jobs: list[Any]  # submitit jobs
    states: dict[str, JobState] = field(default_factory=dict)
    pending_since: dict[str, float] = field(default_factory=dict)
    missing: dict[str, int] = field(default_factory=dict)
    queue_failed: bool = False

    def run(self) -> dict[str, JobState]:
        start = time.monotonic()
        self.states = {job.job_id: JobState(job.job_id) for job in self.jobs}
        while not all(s.state in ENDED for s in self.states.values()):
            self.poll()
            if not all(s.state in ENDED for s in self.states.values()):
                time.sleep(min(POLL_MAX_S, POLL_MIN_S + (time.monotonic() - start) / 10))
        return self.states

    def poll(self) -> None:
        queue = read_queue({job.job_id.split("_")[0] for job in self.jobs})
        if queue is None and not self.queue_failed:
            print("slurm: squeue failed; still waiting for the jobs' results", file=sys.stderr, flush=True)
        self.queue_failed = queue is None
        for index, job in enumerate(self.jobs):
            if self.states[job.job_id].state not in ENDED:
                self.update(index, job, _find(queue or {}, job.job_id), listed=queue is not None)

    def update(self, index: int, job: Any, seen: JobState | None, listed: bool = True) -> None:
        old = self.states[job.job_id]
        if seen is None:
            seen = self.vanished(job, old, listed)
        seen.extra = old.extra
        if not is_permanent(seen):
            self.pending_since.pop(job.job_id, None)
        if is_permanent(seen) and not seen.extra and self.pending_too_long(job.job_id):
            subprocess.run(["scancel", job.job_id], capture_output=True, timeout=60)
            seen.extra = (
                f": pending for {seen.reason}, which waiting cannot resolve; cancelled after {PENDING_GRACE_S:.0f} s"
            )
        if (seen.state, seen.reason, seen.extra) != (old.state, old.reason, old.extra):
            print(f"slurm: job #{index} {seen.describe()}{_hint(seen)}", flush=True)
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


# ------------------------------------------------------------------------------------------ launcher


class SlurmLauncher(SubmititSlurmLauncher):
    """hydra-submitit-launcher's SLURM launcher, fitted to the partition and following jobs with squeue."""

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        quiet_sacct_warnings()
        try:
            self.params = fit_request(self.params, read_partition(self.params.get("partition")))
        except LaunchRefused as error:
            refuse(str(error))
        jobs = self._submit(job_overrides, initial_job_idx)
        follower = Follower(jobs)
        try:
            states = follower.run()
        except BaseException:  # Ctrl-C, SIGTERM: nothing of the sweep keeps running on the cluster
            follower.cancel_all()
            raise
        return [
            self._job_return(job, list(overrides), initial_job_idx + i, states[job.job_id])
            for i, (job, overrides) in enumerate(zip(jobs, job_overrides, strict=True))
        ]

    def __call__(self, *args: Any, **kwargs: Any) -> JobReturn:
        # In the job. SLURM sends USR2 `signal_delay_s` before the time limit to every process of the job,
        # the measuring worker included, whose default action would be to die at once; submitit's own handler
        # would raise in the middle of the job. Ignored (inherited by the worker), the job runs to its limit.
        signal.signal(signal.SIGUSR2, signal.SIG_IGN)
        return super().__call__(*args, **kwargs)

    def _submit(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> list[Any]:
        executor = self._executor()
        sweep_dir = Path(str(self.config.hydra.sweep.dir))
        sweep_dir.mkdir(parents=True, exist_ok=True)
        request = ", ".join(
            f"{k}={self.params.get(k)}" for k in ("partition", "cpus_per_task", "mem_gb", "timeout_min")
        )
        print(f"slurm: submitting {len(job_overrides)} jobs ({request}); sweep in {sweep_dir}", flush=True)
        state = Singleton.get_state()
        params = [
            (list(o), "hydra.sweep.dir", initial_job_idx + i, f"job_id_for_{initial_job_idx + i}", state)
            for i, o in enumerate(job_overrides)
        ]
        return executor.map_array(self, *zip(*params, strict=True))

    def _executor(self) -> Any:
        import submitit
        from hydra_plugins.hydra_submitit_launcher.config import BaseQueueConf

        executor = submitit.AutoExecutor(
            cluster="slurm",
            folder=self.params["submitit_folder"],
            slurm_max_num_timeout=self.params["max_num_timeout"],
        )
        shared = set(OmegaConf.structured(BaseQueueConf).keys())
        specific = {"submitit_folder", "max_num_timeout"}
        executor.update_parameters(
            **{k if k in shared else f"slurm_{k}": v for k, v in self.params.items() if k not in specific}
        )
        return executor

    def _job_return(self, job: Any, overrides: list[str], index: int, state: JobState) -> JobReturn:
        returned = None
        if state.state == "TIMEOUT":
            state.extra += f": past its time limit, hydra.launcher.timeout_min={self.params.get('timeout_min')}"
        if job.paths.result_pickle.exists():
            try:
                returned = job.results()[0]
            except Exception as error:
                state.extra += f": the job raised {first_line(error)}"
        if returned is not None and state.state in ("COMPLETED", "UNKNOWN_END") and not state.extra:
            return returned
        run_dir, task_cfg = cluster_jobs.job_config(self.hydra_context, self.config, overrides, index)
        record_slurm_end(task_cfg, run_dir, state)
        return returned or JobReturn(
            overrides=overrides, working_dir=str(run_dir), status=JobStatus.COMPLETED, _return_value="FAILED"
        )


def refuse(line: str) -> None:
    """No job submitted: say why in one line, record it on the sweep (sweep.json, parent run), exit 1."""
    from runner import sweep

    active = sweep.active()
    if active is not None:
        active.note["launch_error"] = line
        _tag_parent(active.note, line)
    else:
        print(f"error: {line}", file=sys.stderr)
    raise SystemExit(1)


def _tag_parent(note: dict, line: str) -> None:
    if not note.get("parent_run_id"):
        return
    from runner import tracking

    try:
        tracking.retry_on_lock(tracking.client(note["uri"]).set_tag, note["parent_run_id"], "error", line)
    except Exception as error:  # sweep.json keeps the reason whatever the store does
        print(f"warning: could not tag the parent run ({first_line(error)})", file=sys.stderr)


# ------------------------------------------------------------------------------------ the job's record


def record_slurm_end(task_cfg: DictConfig, run_dir: Path, state: JobState) -> None:
    """Record a job SLURM ended as FAILED with SLURM's state and reason (runner.cluster_jobs)."""
    context = {"slurm_job_id": state.slurm_job_id} if state.slurm_job_id else {}
    cluster_jobs.record_ended(task_cfg, run_dir, state.describe(), context)


# ------------------------------------------------------------------------------------------- logging


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

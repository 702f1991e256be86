"""SLURM sweeps that fit the cluster they are sent to (`hydra/launcher=slurm`, submitit underneath).

`SlurmLauncher` is hydra-submitit-launcher's, changed where a real cluster showed it wanting:
- Every job is submitted with `--exclusive` (`hydra.launcher.exclusive`, true by default) so jobs never share
  a node while they time; `mem_gb` left null is then `--mem=0` (all of the node's memory), and
  `cpus_per_task` left null is the cores of the partition's smallest node that can hold the job.
- A job whose config has `device=cuda` asks for `gpus_per_cuda_job` GPUs (unless `gpus_per_node`,
  `gpus_per_task` or a GPU `gres` is set, which every job then asks for); jobs asking differently are
  submitted as separate arrays.
- Before anything is submitted it reads the partition with `sinfo`: a request no node of the partition can
  hold (cores, memory, GPUs, nodes, time) is refused with one line, the sweep exits 1 and its parent run is
  FAILED.
- It logs each job's overrides as submitit's launcher does, and applies `hydra.sweep.mode` to the sweep
  directory when set.
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
import os
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
from hydra.core.utils import JobReturn, JobStatus, filter_overrides
from hydra_plugins.hydra_submitit_launcher.config import BaseQueueConf, SlurmQueueConf
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
OWN_KEYS = {"submitit_folder", "max_num_timeout", "exclusive", "gpus_per_cuda_job"}  # not sbatch parameters as they are
SHOWN = ("partition", "exclusive", "cpus_per_task", "mem", "gpus_per_node", "gpus_per_task", "gres", "time")

log = logging.getLogger(__name__)


@dataclass
class SlurmConf(SlurmQueueConf):
    """hydra-submitit-launcher's SLURM settings and this launcher's own (conf/hydra/launcher/slurm.yaml)."""

    _target_: str = "hydra_plugins.tensor_runner.slurm_launcher.SlurmLauncher"
    exclusive: bool = True  # sbatch --exclusive: a node per job
    gpus_per_cuda_job: int = 1  # gpus_per_node of a device=cuda job, unless GPUs are asked for explicitly


class LaunchRefused(Exception):
    """One line: why no job of the sweep was submitted."""


@dataclass(frozen=True)
class Node:
    name: str
    cpus: int
    memory_mb: int
    gpus: int

    def describe(self) -> str:
        memory = f", {self.memory_mb / 1024:.1f} GB" if self.memory_mb else ""
        gpus = f", {self.gpus} GPU{'s' * (self.gpus != 1)}" if self.gpus else ""
        return f"{self.cpus} CPUs{memory}{gpus}"


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


def gpus_set(params: dict[str, Any]) -> bool:
    """Whether hydra.launcher asks for GPUs itself: then every job asks for what it says."""
    gres = str(params.get("gres") or "")
    return params.get("gpus_per_node") is not None or params.get("gpus_per_task") is not None or "gpu" in gres


def job_request(params: dict[str, Any], device: str) -> dict[str, Any]:
    """The launcher's request for one job: `gpus_per_cuda_job` GPUs when it runs on cuda, unless set."""
    request = dict(params)
    if device == "cuda" and not gpus_set(params) and params.get("gpus_per_cuda_job"):
        request["gpus_per_node"] = params["gpus_per_cuda_job"]
    return request


def fit_arrays(
    params: dict[str, Any], devices: Sequence[str], partition: Partition, first: int = 0
) -> list[tuple[dict[str, Any], list[int]]]:
    """(request, the jobs' positions) per array: one per distinct request, each fitted to the partition."""
    groups: dict[Any, list[int]] = {}
    for position, device in enumerate(devices):
        groups.setdefault(job_request(params, device).get("gpus_per_node"), []).append(position)
    arrays = []
    for positions in groups.values():
        request = job_request(params, devices[positions[0]])
        who = "hydra.launcher asks"
        if request.get("gpus_per_node") != params.get("gpus_per_node"):
            gpus = request["gpus_per_node"]
            who = f"jobs {_numbers([first + p for p in positions])} (device=cuda, gpus_per_cuda_job={gpus}) ask"
        arrays.append((fit_request(request, partition, who), positions))
    return arrays


def _numbers(numbers: list[int]) -> str:
    shown = ", ".join(f"#{n}" for n in numbers[:4])
    return shown if len(numbers) <= 4 else f"{shown}, ... ({len(numbers)} jobs)"


def fit_request(params: dict[str, Any], partition: Partition, who: str = "hydra.launcher asks") -> dict[str, Any]:
    """params with null cpus_per_task filled from the partition; LaunchRefused if no node can hold it."""
    if partition.available != "up":
        raise LaunchRefused(f"SLURM partition {partition.name} is {partition.available} (sinfo): no job can start")
    params = dict(params)
    if params.get("cpus_per_task") is None:
        # --exclusive gives the job the whole node, but its srun step only cpus_per_task CPUs of it
        gpus = params.get("gpus_per_node") or 0
        nodes = [node for node in partition.nodes if node.gpus >= gpus] or partition.nodes
        smallest = min(nodes, key=lambda node: (node.cpus, node.memory_mb))
        params["cpus_per_task"] = max(1, smallest.cpus // (params.get("tasks_per_node") or 1))
    check_fits(params, partition, who)
    limit = partition.max_time_min
    if limit is not None and params.get("timeout_min", 0) > limit:
        raise LaunchRefused(
            f"hydra.launcher.timeout_min={params['timeout_min']} is longer than partition {partition.name} allows "
            f"({limit} min, sinfo): lower timeout_min"
        )
    return params


def check_fits(params: dict[str, Any], partition: Partition, who: str = "hydra.launcher asks") -> None:
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
    if want.gpus and not any(node.gpus for node in partition.nodes):
        raise LaunchRefused(
            f"{who} for GPUs, but partition {partition.name} has none (sinfo): "
            "choose a partition with GPUs (hydra.launcher.partition)"
        )
    largest = max(partition.nodes, key=lambda node: (node.cpus, node.memory_mb, node.gpus))
    count = f"{nodes} nodes with " if nodes > 1 else ""
    raise LaunchRefused(
        f"{who} for {count}{want.describe()} per node, but partition {partition.name} has "
        f"{len(fitting)} such nodes (its largest: {largest.describe()}, sinfo): lower cpus_per_task / mem_gb / "
        "gpus_per_node, or leave cpus_per_task and mem_gb null to fit the partition"
    )


def executor_parameters(request: dict[str, Any]) -> dict[str, Any]:
    """The request as submitit's AutoExecutor parameters, with --exclusive and --mem=0 where they apply."""
    shared = set(OmegaConf.structured(BaseQueueConf).keys())
    parameters = {k if k in shared else f"slurm_{k}": v for k, v in request.items() if k not in OWN_KEYS}
    if request.get("exclusive"):
        parameters["slurm_exclusive"] = True
        if all(request.get(k) is None for k in ("mem_gb", "mem_per_cpu", "mem_per_gpu")):
            parameters["slurm_mem"] = "0"  # SLURM's "all the memory of the node"
    return parameters


def sbatch_summary(parameters: dict[str, Any]) -> str:
    """The sbatch options that size a job, as sbatch spells them (submitit's SLURM parameters)."""
    flags = [(key.replace("_", "-"), parameters.get(key)) for key in SHOWN]
    return " ".join(f"--{key}" if value is True else f"--{key}={value}" for key, value in flags if value is not None)


def sweep_mode(mode: Any) -> int | None:
    """hydra.sweep.mode as permission bits (octal digits, as submitit's launcher reads it); None when unset."""
    if mode is None:
        return None
    if not re.fullmatch(r"0?[0-7]{3,4}", str(mode)):
        raise LaunchRefused(f"hydra.sweep.mode={mode} is not a file mode in octal digits, e.g. 775")
    return int(str(mode), 8)


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

    jobs: list[Any]  # submitit jobs, in the sweep's order
    first: int = 0  # the first job's number in the sweep
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
            print(f"slurm: job #{self.first + index} {seen.describe()}{_hint(seen)}", flush=True)
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
    """hydra-submitit-launcher's SLURM launcher: a node per job, fitted to the partition, followed with squeue."""

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        quiet_sacct_warnings()
        try:
            partition = read_partition(self.params.get("partition"))
            devices = self._devices(job_overrides, initial_job_idx)
            arrays = fit_arrays(self.params, devices, partition, initial_job_idx)
            sweep_dir = self._sweep_dir()
        except LaunchRefused as error:
            cluster_jobs.refuse(str(error))
        jobs = self._submit(job_overrides, initial_job_idx, arrays, sweep_dir)
        follower = Follower(jobs, first=initial_job_idx)
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

    def _devices(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> list[str]:
        """Each job's device.name from its composed config, where it decides the GPUs asked for."""
        if gpus_set(self.params) or not self.params.get("gpus_per_cuda_job"):
            return [""] * len(job_overrides)
        return [self._device(list(o), initial_job_idx + i) for i, o in enumerate(job_overrides)]

    def _device(self, overrides: list[str], number: int) -> str:
        try:
            config = self.hydra_context.config_loader.load_sweep_config(self.config, overrides)
            return str(OmegaConf.select(config, "device.name", default=""))
        except Exception as error:  # what the job itself would fail with on its node
            raise LaunchRefused(f"job #{number} ({' '.join(overrides)}): {first_line(error)}") from error

    def _sweep_dir(self) -> Path:
        """The sweep directory, made, with hydra.sweep.mode's permissions when set."""
        sweep_dir = Path(str(self.config.hydra.sweep.dir))
        mode = sweep_mode(self.config.hydra.sweep.get("mode"))
        sweep_dir.mkdir(parents=True, exist_ok=True)
        if mode is not None:
            os.chmod(sweep_dir, mode)
        return sweep_dir

    def _submit(
        self,
        job_overrides: Sequence[Sequence[str]],
        initial_job_idx: int,
        arrays: list[tuple[dict[str, Any], list[int]]],
        sweep_dir: Path,
    ) -> list[Any]:
        """One array per request; the jobs in the sweep's order. A failed sbatch cancels what was submitted."""
        from submitit.core.utils import FailedJobError, FailedSubmissionError

        for number, overrides in enumerate(job_overrides, initial_job_idx):
            log.info(f"\t#{number} : {' '.join(filter_overrides(overrides))}")
        jobs: list[Any] = [None] * len(job_overrides)
        try:
            for request, positions in arrays:
                numbered = [(initial_job_idx + p, list(job_overrides[p])) for p in positions]
                for position, job in zip(positions, self._submit_array(request, numbered, sweep_dir), strict=True):
                    jobs[position] = job
        except (FailedJobError, FailedSubmissionError) as error:
            submitted = [job.job_id for job in jobs if job is not None]
            if submitted:
                subprocess.run(["scancel", *submitted], capture_output=True, timeout=60)
            cluster_jobs.refuse(f"sbatch failed: {first_line(error)}")
        return jobs

    def _submit_array(self, request: dict[str, Any], numbered: list[tuple[int, list[str]]], sweep_dir: Path) -> list:
        """One SLURM array of the (job number, overrides) given, all asking for `request`."""
        executor = self._executor(request)
        summary = sbatch_summary(executor._executor.parameters)
        print(f"slurm: submitting {len(numbered)} jobs ({summary}); sweep in {sweep_dir}", flush=True)
        state = Singleton.get_state()
        params = [(overrides, "hydra.sweep.dir", n, f"job_id_for_{n}", state) for n, overrides in numbered]
        return executor.map_array(self, *zip(*params, strict=True))

    def _executor(self, request: dict[str, Any]) -> Any:
        import submitit

        executor = submitit.AutoExecutor(
            cluster="slurm",
            folder=request["submitit_folder"],
            slurm_max_num_timeout=request["max_num_timeout"],
        )
        executor.update_parameters(**executor_parameters(request))
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

"""What a SLURM partition offers (sinfo) and what a sweep's jobs ask of it: a request per array, fitted
to the partition or refused in one line, as sbatch options."""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from hydra_plugins.hydra_submitit_launcher.config import BaseQueueConf
from omegaconf import OmegaConf

# not sbatch parameters as they are
OWN_KEYS = {"submitit_folder", "max_num_timeout", "exclusive", "gpus_per_cuda_job", "blocks"}
SHOWN = ("partition", "exclusive", "cpus_per_task", "mem", "gpus_per_node", "gpus_per_task", "gres", "time")


class LaunchRefused(Exception):
    """One line: why no job of the sweep was submitted."""


# sinfo's compact node states (%t) that take new jobs; a `*` after one: the node does not answer slurmctld's pings.
TAKES_JOBS = ("idle", "mix", "alloc", "comp", "plnd")


@dataclass(frozen=True)
class Node:
    name: str
    cpus: int
    memory_mb: int
    gpus: int
    state: str = "idle"  # sinfo's %t: idle, mix, alloc, down*, drain, ...
    reason: str = ""  # sinfo's %E, why an administrator or slurmctld set it down or drained

    @property
    def up(self) -> bool:
        """Whether SLURM would start a new job on it: a state that takes jobs, answering pings."""
        return self.state.rstrip("~#!%$@^-") in TAKES_JOBS

    def said(self) -> str:
        """'node-2 down* (Not responding)': the node as sinfo lists it."""
        return f"{self.name} {self.state}" + (f" ({self.reason})" if self.reason else "")

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

    @property
    def up_nodes(self) -> tuple[Node, ...]:
        return tuple(node for node in self.nodes if node.up)

    def not_up(self) -> str:
        """The nodes that take no job, as sinfo lists them: 'node-2 down* (Not responding)'."""
        return ", ".join(node.said() for node in self.nodes if not node.up)


def read_partition(name: str | None) -> Partition:
    """The partition's nodes as `sinfo` lists them (the default partition when name is None)."""
    if shutil.which("sinfo") is None:
        raise LaunchRefused("hydra/launcher=slurm needs SLURM's commands, and sinfo is not on PATH")
    out = subprocess.run(
        ["sinfo", "-h", "-N", "-o", "%P|%a|%N|%c|%m|%G|%l|%t|%E"], capture_output=True, text=True, timeout=30
    )
    if out.returncode != 0:
        raise LaunchRefused(f"sinfo failed: {(out.stderr.strip().splitlines() or [str(out.returncode)])[0]}")
    return parse_sinfo(out.stdout, name)


def parse_sinfo(text: str, name: str | None) -> Partition:
    rows = [line.split("|", 8) for line in text.splitlines() if line.count("|") >= 6]
    names = sorted({row[0].rstrip("*") for row in rows})
    if name is None:
        defaults = [row[0].rstrip("*") for row in rows if row[0].endswith("*")]
        if not defaults:
            raise LaunchRefused(f"no default SLURM partition: set hydra.launcher.partition (one of {names})")
        name = defaults[0]
    mine = [row for row in rows if row[0].rstrip("*") == name]
    if not mine:
        raise LaunchRefused(f"SLURM has no partition {name!r} (sinfo lists {', '.join(names) or 'none'})")
    nodes = {row[2]: _node(row) for row in mine}
    return Partition(name, mine[0][1], tuple(nodes.values()), _minutes(mine[0][6]))


def _node(row: list[str]) -> Node:
    """A node of sinfo's row: its state and reason where the row has them (%t, %E; 'none' is no reason)."""
    state, reason = (row[7:] + ["idle", ""])[:2] if len(row) > 7 else ("idle", "")
    reason = "" if reason.strip() == "none" else reason.strip()
    return Node(row[2], int(row[3].rstrip("+")), int(row[4].rstrip("+")), _gpus(row[5]), state.strip(), reason)


def blocks_refusal(blocks: int, partition: Partition) -> str | None:
    """Why hydra.launcher.blocks=N cannot run on the partition, in one line: each block takes a node of its own, so
    N blocks need N nodes that take jobs (a down or drained node would leave a block waiting, or two blocks on one
    node one after the other). None where it can."""
    up = partition.up_nodes
    if blocks <= len(up):
        return None
    has = f"{len(up)} up of {len(partition.nodes)} ({partition.not_up()})" if partition.not_up() else str(len(up))
    return f"hydra.launcher.blocks={blocks} asks for {blocks} nodes, but partition {partition.name} has {has} (sinfo)"


def blocks_on_partition(blocks: int, partition: str | None) -> str | None:
    """blocks_refusal on the partition as sinfo lists it now; None where it fits, or where sinfo cannot answer (the
    launcher says why when it reads the partition itself)."""
    try:
        return blocks_refusal(blocks, read_partition(partition))
    except (LaunchRefused, OSError, subprocess.SubprocessError):
        return None


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
    if not partition.up_nodes:
        raise LaunchRefused(
            f"no node of SLURM partition {partition.name} takes jobs: {partition.not_up()} (sinfo): no job can start"
        )
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
        n for n in partition.up_nodes if n.cpus >= want.cpus and n.memory_mb >= want.memory_mb and n.gpus >= want.gpus
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
    up = " up" if partition.not_up() else ""
    raise LaunchRefused(
        f"{who} for {count}{want.describe()} per node, but partition {partition.name} has "
        f"{len(fitting)} such nodes{up} (its largest: {largest.describe()}, sinfo): lower cpus_per_task / mem_gb / "
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
    added = parameters.get("additional_parameters") or {}  # flags: --no-requeue for a sweep blocked by node
    flags += [(key.replace("_", "-"), True) for key, value in added.items() if value is True]
    return " ".join(f"--{key}" if value is True else f"--{key}={value}" for key, value in flags if value is not None)


def sweep_mode(mode: Any) -> int | None:
    """hydra.sweep.mode as permission bits (octal digits, as submitit's launcher reads it); None when unset."""
    if mode is None:
        return None
    if not re.fullmatch(r"0?[0-7]{3,4}", str(mode)):
        raise LaunchRefused(f"hydra.sweep.mode={mode} is not a file mode in octal digits, e.g. 775")
    return int(str(mode), 8)

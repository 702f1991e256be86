"""What a run ran on: versions, CPU, device name, thread settings, git commit, scheduler context."""

from __future__ import annotations

import contextlib
import os
import platform
import re
import subprocess
import sys
from collections.abc import Mapping
from functools import cache
from pathlib import Path

from runner import version
from runner.identity import SPEED_VARIABLES
from runner.locations import FROM_CHECKOUT, PROJECT_ROOT
from runner.record.machine_state import machine_state

# How the frameworks take GPU memory (runner.backends.share_gpu_memory sets the first two in a cuda job's worker).
GPU_MEMORY_VARIABLES = (
    "XLA_PYTHON_CLIENT_PREALLOCATE",
    "TF_FORCE_GPU_ALLOW_GROWTH",
    "XLA_PYTHON_CLIENT_MEM_FRACTION",
    "XLA_CLIENT_MEM_FRACTION",
    "XLA_PYTHON_CLIENT_ALLOCATOR",
)
# Where a scheduler placed the job: environment variable -> key in `environment` (and MLflow tag env.KEY).
SCHEDULER_VARIABLES = {
    "SLURM_JOB_ID": "slurm_job_id",
    "SLURM_ARRAY_JOB_ID": "slurm_array_job_id",
    "SLURM_ARRAY_TASK_ID": "slurm_array_task_id",
    "SLURMD_NODENAME": "slurm_node",
    "SLURM_JOB_PARTITION": "slurm_partition",
    "RAY_JOB_ID": "ray_job_id",
}
ADDR_NO_RANDOMIZE = 0x0040000  # linux/personality.h


def layout_randomized() -> bool | None:
    """Whether this process started with a randomized address space (None where Linux does not say)."""
    try:
        persona = int(Path("/proc/self/personality").read_text(), 16)
    except (OSError, ValueError):
        return None
    return not persona & ADDR_NO_RANDOMIZE


def collect(backend_env: dict) -> dict:
    """The machine's facts merged with what the backend reports about itself."""
    import numpy as np

    env = {
        "tensor_runner": version(),
        "python": platform.python_version(),
        "numpy": np.__version__,
        "platform": platform.platform(),
        "hostname": platform.node(),
        "cpu": cpu_name(),
        "cpu_count": os.cpu_count(),
        "memory_gib": memory_gib(),
        "argv": " ".join(sys.argv),
        "address_layout_randomized": layout_randomized(),
        "git_commit": "unknown",
        **git_source(),
    }
    if nvidia_driver_version():
        env["gpu_driver"] = nvidia_driver_version()
    if gpu_models():
        env["gpus"] = gpus_said(gpu_models())
    env.update({name: os.environ[name] for name in (*SPEED_VARIABLES, *GPU_MEMORY_VARIABLES) if name in os.environ})
    env.update(scheduler_context())
    env.update(machine_state())  # CPU clock and governor, GPU clocks, temperature and throttling where readable
    env.update(backend_env)
    env.setdefault("device_name", env["cpu"])
    return env


def scheduler_context(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The SLURM job/array ids, node and partition, or Ray's job id, of the job this process belongs to."""
    environ = os.environ if environ is None else environ
    context = {key: environ[name] for name, key in SCHEDULER_VARIABLES.items() if environ.get(name)}
    ray_job = _ray_job_id() or context.pop("ray_job_id", "")
    if ray_job.strip("f"):  # a worker Ray started before any job holds the nil id, ffffffff
        context["ray_job_id"] = ray_job
    return context


def export_ray_job_id() -> None:
    """In a Ray task, hand Ray's job id to the measuring worker, a fresh process that never imports Ray."""
    ray_job = _ray_job_id()
    if ray_job:
        os.environ["RAY_JOB_ID"] = ray_job


def _ray_job_id() -> str | None:
    """Ray's job id when this process is a Ray worker (Ray is never imported here for it)."""
    ray = sys.modules.get("ray")
    if ray is None or not ray.is_initialized():
        return None
    return ray.get_runtime_context().get_job_id()


@cache
def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


@cache
def memory_gib() -> int:
    """The machine's memory in whole GiB (the kernel's total moves by megabytes between boots and kernels)."""
    import psutil

    return round(psutil.virtual_memory().total / 2**30)


@cache
def gpu_models(gpus: Path = Path("/proc/driver/nvidia/gpus")) -> tuple[str, ...]:
    """The model of each NVIDIA GPU the driver sees, from its information file ('Model: NVIDIA H100 80GB HBM3'),
    whatever the job's CUDA_VISIBLE_DEVICES: the machine's GPUs, not the run's. Empty without the driver."""
    models = []
    for information in sorted(gpus.glob("*/information")):
        with contextlib.suppress(OSError):
            for line in information.read_text().splitlines():
                if line.startswith("Model:"):
                    models.append(line.split(":", 1)[1].strip())
    return tuple(models)


def gpus_said(models: tuple[str, ...]) -> str:
    """'8x NVIDIA H100 80GB HBM3'; several models, each with its count, in order: '1x NVIDIA A100, 1x NVIDIA T4'."""
    counts = {m: models.count(m) for m in dict.fromkeys(models)}
    return ", ".join(f"{n}x {m}" for m, n in counts.items())


@cache
def nvidia_driver_version() -> str:
    """The NVIDIA kernel driver's version ('535.104.05'), '' without one: part of what a GPU run ran on."""
    try:
        return driver_version(Path("/proc/driver/nvidia/version").read_text())
    except OSError:
        return ""


def driver_version(banner: str) -> str:
    """The version in the first line of /proc/driver/nvidia/version (proprietary or open kernel module)."""
    match = re.search(r"Kernel Module\s+(?:for \S+\s+)?([0-9][0-9.]*)", banner)
    return match.group(1) if match else banner.split("\n", 1)[0].strip()


@cache
def git_source() -> dict[str, str]:
    """The runner's commit, branch and whether tracked files differ from it ("true"/"false"): a benchmark of
    uncommitted code must not pass for HEAD's. Empty outside a git checkout, and for an installed wheel (whose
    version is recorded as tensor_runner): the git repository around its environment is not the runner's."""
    commit = _git("rev-parse", "HEAD") if FROM_CHECKOUT else None
    if commit is None:
        return {}
    branch = _git("rev-parse", "--abbrev-ref", "HEAD")
    changes = _git("status", "--porcelain", "--untracked-files=no")
    source = {"git_commit": commit, "git_branch": branch or "unknown"}
    if changes is not None:
        source["git_dirty"] = "true" if changes else "false"
    return source


def _git(*args: str) -> str | None:
    try:
        out = subprocess.run(["git", *args], cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() if out.returncode == 0 else None

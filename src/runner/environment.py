"""What a run ran on: versions, CPU, device name, thread settings, git commit."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from functools import cache

from runner.config import PROJECT_ROOT

THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "TF_NUM_INTRAOP_THREADS")


def collect(backend_env: dict) -> dict:
    """The machine's facts merged with what the backend reports about itself."""
    import numpy as np

    env = {
        "python": platform.python_version(),
        "numpy": np.__version__,
        "platform": platform.platform(),
        "hostname": platform.node(),
        "cpu": cpu_name(),
        "cpu_count": os.cpu_count(),
        "git_commit": git_commit(),
        "argv": " ".join(sys.argv),
    }
    env.update({name: os.environ[name] for name in THREAD_VARIABLES if name in os.environ})
    env.update(backend_env)
    env.setdefault("device_name", env["cpu"])
    return env


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
def git_commit() -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    return out.stdout.strip() if out.returncode == 0 else "unknown"

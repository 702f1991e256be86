"""timing.profile: after a job is timed, its call made again under a profiler for a moment, and what it found written
beside the record: `profile.json`, the functions (or a framework's operators) by their self time per call, which
`runner history` reads to say where a step's time went, and the profiler's own file. torch jobs use torch.profiler
(its operators, aten::mm, aten::relu, with their CPU and device self time; `profile.trace.json`, a Chrome trace for
Perfetto or chrome://tracing); the others cProfile (the Python functions and the C functions they call, NumPy's
among them; `profile.pstats`, for pstats or snakeviz), which does not see a compiled framework's own kernels. The
calls run after the timed ones, so the profiler's cost is in no timing."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

from runner.record.result import PROFILE_FILE, PROFILE_SUMMARY, PROFILE_TRACE

SECONDS = 0.5  # profiled for at least this long ...
MIN_CALLS = 3  # ... and at least this many calls
TOP = 40  # the functions profile.json keeps, by self time


def record(
    step: Callable[[], object], sync: Callable[[], None], run_dir: Path, backend: str = "", device: str = "cpu"
) -> int:
    """Make `step` (synced after each call) for SECONDS and MIN_CALLS or more under the backend's profiler
    (torch.profiler for torch, else cProfile), and write PROFILE_SUMMARY and the profiler's file into `run_dir`;
    returns the calls made."""
    if backend == "torch":
        profiler, functions = _torch_profiler(device), _torch_functions
    else:
        profiler, functions = _cprofile(), _cprofile_functions
    with profiler as found:
        calls = _calls(step, sync)
    summary: dict[str, Any] = {"profiler": "torch.profiler" if backend == "torch" else "cProfile", "calls": calls}
    summary["functions"] = sorted(functions(found, run_dir, calls), key=lambda f: -f["self_s"])[:TOP]
    (run_dir / PROFILE_SUMMARY).write_text(json.dumps(summary, indent=1))
    return calls


def _calls(step: Callable[[], object], sync: Callable[[], None]) -> int:
    calls, start = 0, time.perf_counter()
    while calls < MIN_CALLS or time.perf_counter() - start < SECONDS:
        step()
        sync()
        calls += 1
    return calls


class _cprofile(AbstractContextManager):
    def __enter__(self) -> Any:
        import cProfile

        self.profiler = cProfile.Profile()
        self.profiler.enable()
        return self.profiler

    def __exit__(self, *_: object) -> None:
        self.profiler.disable()


def _cprofile_functions(profiler: Any, run_dir: Path, calls: int) -> list[dict]:
    import pstats

    profiler.dump_stats(run_dir / PROFILE_FILE)
    stats = pstats.Stats(profiler).stats  # type: ignore[attr-defined]  # {(file, line, name): (cc, nc, tt, ct, ...)}
    return [
        {"function": _name(key), "self_s": tt / calls, "calls": nc / calls} for key, (_, nc, tt, *_) in stats.items()
    ]


def _name(key: tuple[str, int, str]) -> str:
    """'numpy_backend.py:41(matmul)', or a C function as cProfile names it ('{built-in method numpy...}')."""
    file, line, name = key
    return name if file == "~" else f"{Path(file).name}:{line}({name})"


def _torch_profiler(device: str) -> Any:
    os.environ.setdefault("KINETO_LOG_LEVEL", "5")  # no 'ERROR ... gpuGetDeviceCount failed' on a CPU-only machine
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU, *([ProfilerActivity.CUDA] if device.startswith("cuda") else [])]
    return profile(activities=activities)


def _torch_functions(profiler: Any, run_dir: Path, calls: int) -> list[dict]:
    """Each operator's self time on the CPU and on the device, per call (microseconds in torch's averages)."""
    profiler.export_chrome_trace(str(run_dir / PROFILE_TRACE))
    return [
        {
            "function": event.key,
            "self_s": (event.self_cpu_time_total + getattr(event, "self_device_time_total", 0.0)) / 1e6 / calls,
            "calls": event.count / calls,
        }
        for event in profiler.key_averages()
    ]

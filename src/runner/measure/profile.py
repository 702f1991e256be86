"""timing.profile: after a job is timed, its call made again under cProfile for a moment, and what it found written
beside the record: `profile.pstats` (cProfile's own file, for pstats, snakeviz or gprof2dot) and `profile.json`, the
functions by their self time per call, which `runner history` reads to say where a step's time went. cProfile sees
the Python functions and the C functions they call (NumPy's among them); a framework's own kernels need its own
profiler. The calls run after the timed ones, so the profiler's cost is in no timing."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path

from runner.record.result import PROFILE_FILE, PROFILE_SUMMARY

SECONDS = 0.5  # profiled for at least this long ...
MIN_CALLS = 3  # ... and at least this many calls
TOP = 40  # the functions profile.json keeps, by self time


def record(step: Callable[[], object], sync: Callable[[], None], run_dir: Path) -> int:
    """Make `step` (synced after each call) for SECONDS and MIN_CALLS or more under cProfile, and write PROFILE_FILE
    and PROFILE_SUMMARY into `run_dir`; returns the calls made."""
    import cProfile
    import pstats

    profiler, calls = cProfile.Profile(), 0
    start = time.perf_counter()
    profiler.enable()
    try:
        while calls < MIN_CALLS or time.perf_counter() - start < SECONDS:
            step()
            sync()
            calls += 1
    finally:
        profiler.disable()
    profiler.dump_stats(run_dir / PROFILE_FILE)
    stats = pstats.Stats(profiler).stats  # type: ignore[attr-defined]  # {(file, line, name): (cc, nc, tt, ct, ...)}
    functions = sorted(
        ({"function": _name(key), "self_s": tt / calls, "calls": nc / calls} for key, (_, nc, tt, *_) in stats.items()),
        key=lambda f: -f["self_s"],
    )
    summary = {"profiler": "cProfile", "calls": calls, "functions": functions[:TOP]}
    (run_dir / PROFILE_SUMMARY).write_text(json.dumps(summary, indent=1))
    return calls


def _name(key: tuple[str, int, str]) -> str:
    """'numpy_backend.py:41(matmul)', or a C function as cProfile names it ('{built-in method numpy...}')."""
    file, line, name = key
    return name if file == "~" else f"{Path(file).name}:{line}({name})"

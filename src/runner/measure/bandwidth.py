"""The machine's memory bandwidth, measured once per machine and kept: what decoding's achieved bandwidth is read
against (task=generate's `decode_bandwidth_share`).

Measured as STREAM measures it, in NumPy: Copy (b = a: reads a, writes b) and Add (c = a + b: reads two, writes one),
each one pass of a NumPy ufunc over arrays four times the last-level cache or larger, on every core at once (each
thread its own slice; NumPy lets go of the GIL inside the loop), the best of a few repeats, bytes counted as STREAM
counts them (what the kernel reads and writes, not the write-allocate reads a cache adds). STREAM's Triad
(a = b + s c) would take NumPy two passes, so it is not among them. The machine's figure is the better of the two.

Kept per kind of machine (runner.identity.machine: CPU model, cores, memory, GPUs, driver branch, thread settings),
as a JSON file in $XDG_CACHE_HOME/tensor-runner/machines/ (~/.cache/...): a machine of the same kind reads the
figure its first run measured, where the machine was quiet then (a load average at most QUIET_LOAD a core); one
measured busy is measured again by the first run RETRY_BUSY_S or more after it, the best kept, until one is quiet: the
jobs of one sweep read one figure. The probe runs in a process of its own, so that its arrays (three of 128 MiB or
more) never count in a run's peak memory; one run measures at a time (a lock beside the file), and those that waited
read its figure.

A GPU's own memory is not measured: its figure is the peak its memory bus gives, as NVML reads it off the device (bus
width x the memory's highest clock x 2 for double data rate; an H100 SXM's 5120 bits at 2619 MHz give 3.35 TB/s, the
figure NVIDIA states), the ceiling decoding on that GPU is read against.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import math
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

# a figure measured while the machine's load average was above this per core is provisional: measured again by a
# later run, the better kept (at load 7.6 on 2 cores it read 28.6 GB/s, quiet 55-58)
QUIET_LOAD = 0.5
RETRY_BUSY_S = 3600.0  # a provisional figure stands this long: a sweep's jobs, the load they make among them, read one
SMALLEST = 128 * 2**20  # bytes of one array at least: four times the last-level cache of most machines
REPEATS = 5


def machines_dir() -> Path:
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path("~/.cache").expanduser())
    return Path(cache) / "tensor-runner" / "machines"


def this_machine() -> Any:
    """This machine's kind (runner.identity.Key), from the facts a run's environment records."""
    from runner.identity import SPEED_VARIABLES, machine
    from runner.record.environment import cpu_name, gpu_models, gpus_said, memory_gib, nvidia_driver_version

    facts = {"cpu": cpu_name(), "cpu_count": os.cpu_count(), "memory_gib": memory_gib()}
    facts |= {"gpus": gpus_said(gpu_models()), "gpu_driver": nvidia_driver_version()}
    return machine(facts | {k: os.environ[k] for k in SPEED_VARIABLES if k in os.environ})


def machine_bandwidth(folder: Path | None = None) -> dict[str, Any]:
    """The machine's measured bandwidth: {"GBps", "copy_GBps", "add_GBps", "threads", "array_MB", "machine",
    "measured"}, read from the machine's file, or measured now (about a second) and written there; {} where the probe
    failed and nothing was kept."""
    kind = this_machine()
    path = (folder or machines_dir()) / f"{kind.key}.json"
    kept = _kept(path)
    if _stands(kept):
        return kept
    path.parent.mkdir(parents=True, exist_ok=True)
    with _one_at_a_time(path.with_name(f".{path.name}.lock")):
        again = _kept(path)  # changed: another run measured while this one waited, and its figure stands for both
        return again if again and again != kept else _measure_and_keep(path, kind, kept)


def _kept(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):  # not measured yet (or a file no run could have left whole: measured again)
        return {}


def _stands(kept: dict[str, Any]) -> bool:
    return bool(kept) and (_quiet(kept) or time.time() - kept.get("tried_s", 0.0) < RETRY_BUSY_S)


@contextlib.contextmanager
def _one_at_a_time(lock: Path) -> Iterator[None]:
    """Held while a run measures: a sweep's jobs that find no figure at once (recording side by side, a joblib
    launcher's) measured three at a time, each on a memory bus the others shared, and recorded 7.9, 9.3 and 20.0 GB/s
    (issue 77); the others wait, then read the one figure measured."""
    with open(lock, "a") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(held, fcntl.LOCK_UN)


def _measure_and_keep(path: Path, kind: Any, kept: dict[str, Any]) -> dict[str, Any]:
    """Measure now (measure_apart) and write the machine's file: the better figure where one is kept."""
    measured = measure_apart()
    if not measured:
        return kept
    figures = {**measured, "machine": kind.name, "measured": time.strftime("%Y-%m-%dT%H:%M:%S")}
    figures["load_1m"] = os.getloadavg()[0]
    if kept.get("GBps", 0.0) > figures["GBps"]:  # a ceiling: the better of a busy machine's measurements stands
        figures = {**kept, "load_1m": min(kept.get("load_1m", math.inf), figures["load_1m"])}
    figures["tried_s"] = time.time()
    written = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    written.write_text(json.dumps(figures, indent=1) + "\n")
    os.replace(written, path)  # whole: a run reading it without the lock reads the old file or the new
    return figures


def _quiet(figures: dict[str, Any]) -> bool:
    return figures.get("load_1m", math.inf) <= QUIET_LOAD * (os.cpu_count() or 1)


def measure_apart() -> dict[str, Any]:
    """measure() in a process of its own (its arrays are sized here, and never count in this process's peak memory)."""
    array_bytes = max(SMALLEST, 4 * last_level_cache())
    code = f"import json; from runner.measure.bandwidth import measure; print(json.dumps(measure({array_bytes})))"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}  # this process's runner
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    try:
        return json.loads(done.stdout.splitlines()[-1])
    except (IndexError, ValueError):  # the probe failed: no figure, rather than a failed run
        return {}


def gpu_peak_bandwidth() -> dict[str, Any]:
    """The first visible NVIDIA GPU's peak memory bandwidth from NVML: {"GBps", "how"}; {} where NVML cannot say
    (no pynvml, no driver), with the reason under "unavailable"."""
    try:
        import pynvml  # light, and imported only for a run on cuda

        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        bits = int(pynvml.nvmlDeviceGetMemoryBusWidth(handle))
        mhz = int(pynvml.nvmlDeviceGetMaxClockInfo(handle, pynvml.NVML_CLOCK_MEM))
        name = pynvml.nvmlDeviceGetName(handle)
    except Exception as error:  # no pynvml, an old driver, a GPU NVML does not know
        return {"unavailable": f"NVML: {error.__class__.__name__}: {error}"}
    gbps = bits / 8 * mhz * 1e6 * 2 / 1e9
    name = name.decode() if isinstance(name, bytes) else name
    return {"GBps": gbps, "how": f"{name}'s peak: a {bits}-bit memory bus at {mhz} MHz, double data rate (NVML)"}


def measure(array_bytes: int | None = None, threads: int | None = None) -> dict[str, Any]:
    """STREAM's Copy and Add in NumPy on `threads` threads (every core the process may use): GB/s, the best of
    REPEATS."""
    threads = threads or len(os.sched_getaffinity(0))
    n = (array_bytes or max(SMALLEST, 4 * last_level_cache())) // 8 // threads * threads
    a, b, c = np.ones(n), np.full(n, 2.0), np.zeros(n)
    chunks = [slice(i * n // threads, (i + 1) * n // threads) for i in range(threads)]
    with ThreadPoolExecutor(threads) as pool:
        copy = _best(pool, chunks, lambda s: np.copyto(b[s], a[s]))
        add = _best(pool, chunks, lambda s: np.add(a[s], b[s], out=c[s]))
    copy_gbps, add_gbps = 2 * 8 * n / copy / 1e9, 3 * 8 * n / add / 1e9
    return {
        "GBps": max(copy_gbps, add_gbps),
        "copy_GBps": copy_gbps,
        "add_GBps": add_gbps,
        "threads": threads,
        "array_MB": 8 * n / 1e6,
    }


def _best(pool: ThreadPoolExecutor, chunks: list[slice], kernel: Any) -> float:
    """The fastest of REPEATS passes of kernel over every chunk at once, in seconds (a first pass untimed: the
    pages are touched and the threads started)."""
    list(pool.map(kernel, chunks))
    times = []
    for _ in range(REPEATS):
        began = time.perf_counter()
        list(pool.map(kernel, chunks))
        times.append(time.perf_counter() - began)
    return min(times)


def last_level_cache(cpus: Path = Path("/sys/devices/system/cpu")) -> int:
    """The largest cache of the machine in bytes, every instance of it counted (two sockets: twice); 0 unknown."""
    sizes: dict[str, int] = {}
    for index in cpus.glob("cpu[0-9]*/cache/index[0-9]*"):
        try:
            size = _bytes((index / "size").read_text().strip())
            sizes[f"{index.name}:{(index / 'shared_cpu_list').read_text().strip()}"] = size
        except (OSError, ValueError):
            continue
    if not sizes:
        return 0
    largest = max(sizes.values())
    return sum(size for size in sizes.values() if size == largest)


def _bytes(size: str) -> int:
    units = {"K": 2**10, "M": 2**20, "G": 2**30}
    return int(size[:-1]) * units[size[-1]] if size[-1] in units else int(size)

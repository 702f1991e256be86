"""Sizes beyond the machine: refuse a job that cannot fit before anything is allocated, and say up front
what a job that will outlast its time budget is going to cost.

Workloads state one forward call's sizes (`Workload.forward_size`), which each task scales to its own call
(`Task.array_elements` -> {"weights", "inputs", "results", "activations"} element counts, `Task.flops`). The
estimate counts the arrays the job holds at once (the seeded float64 draws, the dtype copies on the device, the
float64 reference's copies and results); activations inside a call are counted only where the workload names them
(the transformer's, with attention's seq_len^2 term), so it is a lower bound.
"""

from __future__ import annotations

import time

import numpy as np

from runner.config import ConfigError, TimingConfig
from runner.measure.blocks import MIN_WARMUP_BLOCKS
from runner.spec import JobSpec

FLOAT64_BYTES = 8
SURELY_SLOWER_FLOPS = 1e9  # float64 FLOP/s that any machine this runs on beats
PROBE_N = 1024  # float64 matmul used to gauge this CPU's rate: 2 GFLOP, tens of milliseconds (smaller ones
# mostly measure BLAS threads waiting for each other on a busy machine)


def memory_needed(e: dict[str, int], itemsize: int, device: str, reference: bool) -> tuple[int, int, int]:
    """(host bytes, device bytes, the float64 reference's share of host bytes) a job whose arrays have `e` elements
    (Task.array_elements) holds at once."""
    held = e["weights"] + e["inputs"]
    made = e["results"] + e.get("activations", 0)  # what a call makes: its results, and what it keeps meanwhile
    native = itemsize * (held + made)
    reference_bytes = FLOAT64_BYTES * (held + made) if reference else 0
    draws = FLOAT64_BYTES * held  # the seeded float64 weights and inputs live through the run
    if device == "cuda":
        return draws + itemsize * held + reference_bytes, native, reference_bytes
    return draws + native + reference_bytes, 0, reference_bytes


def check_memory(
    label: str, host: int, device_bytes: int, reference_bytes: int, device: str, what: str = "inputs, weights, results"
) -> None:
    """Raise ConfigError (one line: the estimate, `what` it counts, and what is free) when the job cannot fit."""
    import psutil

    free_host = psutil.virtual_memory().available
    hint = " (or set check_reference=false)" if reference_bytes and host - reference_bytes <= free_host else ""
    if host > free_host:
        raise ConfigError(
            f"{label} needs about {format_bytes(host)} of host memory ({what}"
            f"{', float64 reference' if reference_bytes else ''}) but {format_bytes(free_host)} is free: "
            f"lower the size{hint}"
        )
    free_device = free_device_bytes() if device == "cuda" else None
    if free_device is not None and device_bytes > free_device:
        raise ConfigError(
            f"{label} needs about {format_bytes(device_bytes)} of GPU memory ({what}) "
            f"but {format_bytes(free_device)} is free on the GPU: lower the size"
        )


def free_device_bytes() -> int | None:
    """Free memory of the GPU this process sees, from NVML (no framework, no CUDA context); None if unknown."""
    from runner.measure.energy import nvml_device

    try:
        nvml, handle = nvml_device()
        return int(nvml.nvmlDeviceGetMemoryInfo(handle).free)
    except Exception:  # no nvidia-ml-py or no driver: the framework's own OOM error will say it
        return None


def cost_note(flops: float | None, dtype: str, device: str, reference: bool, timing: TimingConfig) -> str:
    """One line announcing a call of `flops` or its float64 reference estimated to outlast timing.max_time_s; ''
    if none."""
    budget = timing.max_time_s
    if not flops or flops / SURELY_SLOWER_FLOPS <= budget:  # no need to gauge the CPU (0.2 s) for this
        return ""
    rate64 = host_float64_flops()
    reference_s = flops / rate64 if reference else 0.0
    call_s = flops / (rate64 * (2 if dtype == "float32" else 1)) if device == "cpu" else 0.0
    if max(call_s, reference_s) <= budget:
        return ""
    parts = []
    if call_s > budget:  # the first call, calibration's, warm-up's one block past the budget, and one sample
        calls = 3 + (MIN_WARMUP_BLOCKS if timing.warmup_s > 0 or timing.min_warmup_calls > 0 else 0)
        total = format_duration(calls * call_s)
        parts.append(f"one call ≈ {format_duration(call_s)}, at least {calls} calls ≈ {total}")
    if reference_s > budget:
        parts.append(f"the float64 reference ≈ {format_duration(reference_s)} (check_reference=false skips it)")
    return (
        f"{'; '.join(parts)}: estimated from {flops:.2g} FLOP at {rate64 / 1e9:.0f} GFLOP/s (float64 on this CPU"
        f"{', x2 for float32' if call_s and dtype == 'float32' else ''}); timing.max_time_s={budget:g}"
    )


def host_float64_flops(window_s: float = 0.15) -> float:
    """This CPU's float64 matmul rate: the best small product within `window_s` (a busy machine's
    stalls hit some of them, not all)."""
    a = np.random.default_rng(0).standard_normal((PROBE_N, PROBE_N))
    a @ a  # starts BLAS's threads
    best, end = float("inf"), time.perf_counter() + window_s
    while time.perf_counter() < end:
        start = time.perf_counter()
        a @ a
        best = min(best, time.perf_counter() - start)
    return 2 * PROBE_N**3 / max(best, 1e-9)


def format_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if n < 1000 or unit == "TB":
            return f"{n:.3g} {unit}"
        n /= 1000
    return f"{n:.3g} TB"


def format_duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


ITEMSIZE = {"float16": 2, "bfloat16": 2, "float32": 4, "float64": 8}


def check_fits(workload, spec: JobSpec, device: str, task) -> str:
    """Refuse (ConfigError) a job that cannot fit on `device` (as the backend resolved it); return the cost
    note for one that will run long ('' if not). Runs before any array is allocated. The task (runner.tasks.Task)
    sizes its call from the workload's forward; a workload that states none (a user's own `_target_`) is not
    checked."""
    elements = task.array_elements(workload, spec.batch_size, spec.per_example)
    if elements is None:
        return ""
    calls = task.flops(workload, spec.batch_size)
    reference = spec.check_reference and workload.numpy_reference
    needed = memory_needed(elements, ITEMSIZE[spec.dtype], device, reference)
    what = "inputs, weights, results" + (", activations" if elements.get("activations") else "")
    sized = task.size_setting(workload, spec.batch_size)
    label = f"model={spec.model} {sized} dtype={spec.dtype}"
    check_memory(label, *needed, device, what)
    return cost_note(calls, spec.dtype, device, reference, spec.timing)

"""A measurement's figures for the record: the timing statistics, every rate from the time the comparisons use
(rate_time), the per-sample series' metrics, peak memory, and the results that hold NaN or inf."""

from __future__ import annotations

import math
import resource

import numpy as np

from runner.measure.timing import Measurement


def timing_metrics(measurement: Measurement, examples_per_call: int) -> dict:
    metrics = measurement.stats()
    metrics["n_samples"] = len(measurement.samples)
    metrics["calls_per_sample"] = measurement.block_size
    if len(measurement.samples):
        metrics["n_rounds"] = len(set(measurement.samples.rounds))
        metrics["n_processes"] = len(set(measurement.samples.processes))  # timing.processes, as the budget paid
    call_s = rate_time(metrics)
    if call_s:
        metrics["throughput_per_s"] = examples_per_call / call_s
    return metrics


def rate_time(metrics: dict[str, float]) -> float | None:
    """The seconds per call every rate (examples/s, GFLOP/s, a task's tokens/s) is computed from: the typical time,
    which the comparisons use, so that a rate and a ratio beside it tell one story (the median is recorded under its
    own name); the median where there is no typical time. None where neither is a positive time."""
    for key in ("time_typical_s", "time_median_s"):
        value = metrics.get(key)
        if value is not None and math.isfinite(value) and value > 0:
            return value
    return None


def memory_metrics(backend, device: str) -> dict:
    metrics = {"peak_host_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}
    peak_device = backend.peak_device_mb(device)
    if peak_device is not None:
        metrics["peak_device_mb"] = peak_device
    return metrics


def series_metrics(series: dict, measurement: Measurement) -> dict[str, float]:
    """Each series' metrics, from its column of the job's samples (every process's)."""
    columns = measurement.samples.columns
    return {k: v for name, one in series.items() for k, v in one.metrics(columns.get(name, [])).items()}


def non_finite_warnings(tensors: dict[str, np.ndarray]) -> list[str]:
    """One warning per output or gradient that holds NaN or inf (from NaN inputs or weights, overflow, ...)."""
    warnings = []
    for name, array in tensors.items():
        array = np.asarray(array)
        if name.startswith(("outputs/", "gradients/", "trained/")) and array.dtype.kind in "fc":
            bad = int(array.size - np.count_nonzero(np.isfinite(array)))
            if bad:
                warnings.append(f"{name} holds {bad} NaN or infinite values of {array.size}")
    return warnings

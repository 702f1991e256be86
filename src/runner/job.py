"""One job: check the config, run and time the task, record what happened whatever happened."""

from __future__ import annotations

import resource
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from omegaconf import DictConfig, OmegaConf

from runner import tracking
from runner.config import ConfigError, check_combination, choices
from runner.timing import NOISY_REL_IQR, Measurement, MeasurementInterrupted, ProgressLine, format_seconds

WEIGHTS_RECORD_LIMIT = 2_000_000  # weights are written to tensors.h5 when they have fewer elements


@dataclass
class Outcome:
    status: str  # MLflow's words: FINISHED, FAILED, KILLED
    metrics: dict = field(default_factory=dict)
    environment: dict = field(default_factory=dict)
    tensors: dict = field(default_factory=dict)
    attrs: dict = field(default_factory=dict)
    error: str | None = None
    warnings: list[str] = field(default_factory=list)
    predictions: list | None = None  # classifiers: per example, top-5 {"label", "probability"}
    images: np.ndarray | None = None  # image models: NCHW outputs in [-1, 1], written as PNG


def run_job(cfg: DictConfig, before_timing: Callable[[], object] = lambda: None) -> Outcome:
    """Run the configured measurement. Raises ConfigError for combinations that cannot run.

    `before_timing` is called once everything is set up, just before the first timed call."""
    check_combination(cfg)  # before any framework import
    c = choices(cfg)
    from runner import energy, environment, limits
    from runner.backends import load_backend, numpy_backend
    from runner.data import load_inputs
    from runner.models import build_workload, initial_weights
    from runner.tasks import build_task, errors_vs_reference, forward_outputs, reference_results
    from runner.timing import keep_freed_memory, measure

    timing = OmegaConf.to_container(cfg.timing)
    malloc_keeps_freed = timing.pop("keep_freed_memory") and keep_freed_memory()
    workload = build_workload(cfg.model, cfg.data.image_size)
    cost = limits.preflight(workload, cfg, c)  # refuses what cannot fit: before any allocation or framework import
    if cost:
        print(f"note: {cost}", file=sys.stderr, flush=True)
    backend = load_backend(c["backend"])
    load_start = time.perf_counter()  # load_s: device start-up, weights built and placed on the device
    device = backend.prepare(c["device"], c["dtype"])
    rng = np.random.default_rng(cfg.seed)
    params64 = initial_weights(cfg.model, workload, rng)
    host = getattr(workload, "host_params", ())
    state = {
        k: numpy_backend.asarray(v, "cpu", c["dtype"])
        if k in host
        else backend.asarray(backend.to_native_layout(v), device, c["dtype"])
        for k, v in params64.items()
    }
    backend.synchronizer(device)()
    load_s = time.perf_counter() - load_start
    inputs64 = load_inputs(cfg.data, workload, rng, cfg.batch_size)
    inputs = {k: backend.asarray(v, device, c["dtype"]) for k, v in inputs64.items()}
    # What the backend really holds (rounded to dtype): the reference starts from the same values.
    params_held = {k: backend.from_native_layout(backend.to_numpy(v)) for k, v in state.items()}
    inputs_held = {k: backend.to_numpy(v) for k, v in inputs.items()}
    trainable = getattr(workload, "trainable", lambda name: True)
    params = {k: v for k, v in state.items() if trainable(k)}
    constants = {k: v for k, v in state.items() if not trainable(k)}  # e.g. batch-norm running statistics

    task_run = build_task(backend, workload, c["task"], c["mode"], device, params, inputs, constants)
    meter, energy_note = energy.meter_for(device)
    before_timing()
    backend.reset_peak_memory(device)
    progress = ProgressLine(f"{c['backend']} {c['model']} {c['task']} {c['mode']}")
    try:
        measurement, (first_output, results) = measure(
            task_run.step,
            backend.synchronizer(device),
            **timing,
            progress=progress,
            keep=lambda out: (out, task_run.results(out)),  # off the device before the next call reuses it
            energy=meter,
        )
    finally:
        progress.close()

    outcome = Outcome(status="FINISHED")
    outcome.environment = environment.collect(backend.environment(device))
    outcome.environment["device"] = device
    outcome.environment["malloc_keeps_freed_memory"] = malloc_keeps_freed
    outcome.metrics = timing_metrics(measurement, workload.examples_per_call(cfg.batch_size))
    outcome.metrics["load_s"] = load_s
    joules, energy_reason = energy.energy_metrics(
        measurement.energy_j, measurement.timed_calls(), workload.examples_per_call(cfg.batch_size)
    )
    outcome.metrics.update(joules)
    outcome.environment.update({**energy_note, **energy_reason})
    outcome.metrics.update(memory_metrics(backend, device))
    if cfg.check_reference:
        reference = reference_results(workload, c["task"], c["mode"], params_held, inputs_held)
        outcome.metrics.update(errors_vs_reference(results, reference))
    if hasattr(workload, "flops_per_call") and "time_median_s" in outcome.metrics:
        outcome.metrics["gflops_per_s"] = workload.flops_per_call() / outcome.metrics["time_median_s"] / 1e9
    outcome.tensors = {f"inputs/{k}": v for k, v in inputs_held.items()}
    if sum(v.size for v in params_held.values()) <= WEIGHTS_RECORD_LIMIT:
        outcome.tensors.update({f"weights/{k}": v for k, v in params_held.items()})
    outcome.tensors.update(forward_outputs(backend, workload, state, inputs, results))
    outcome.tensors.update(results)
    outcome.tensors["timings/samples_s"] = np.asarray(measurement.samples_s)
    outcome.attrs = {
        **c,
        "device": device,
        "block_size": measurement.block_size,
        "stopped_by": measurement.stopped_by,
    }
    if hasattr(workload, "extra_metrics"):
        outcome.metrics.update(workload.extra_metrics(backend, state, inputs, first_output))
    if getattr(workload, "makes_images", False):
        outcome.images = outcome.tensors["outputs/y"]
    elif getattr(workload, "spec", None) is not None:  # a classifier: top-5 ImageNet classes per example
        outcome.predictions = top5(outcome.tensors["outputs/y"])
    if cost:
        outcome.warnings.append(cost)
    if measurement.rel_iqr() > NOISY_REL_IQR:
        outcome.warnings.append(
            f"noisy measurement: IQR is {measurement.rel_iqr():.0%} of the median; "
            "raise timing.max_time_s or quiet the machine"
        )
    return outcome


def top5(logits: np.ndarray) -> list[list[dict]]:
    """Softmax probabilities of the five most likely ImageNet classes, per example."""
    from runner.models.vision import imagenet_classes

    shifted = logits.astype(np.float64) - logits.max(axis=1, keepdims=True)
    probabilities = np.exp(shifted) / np.exp(shifted).sum(axis=1, keepdims=True)
    names = imagenet_classes()
    return [
        [{"label": names[i], "probability": float(row[i])} for i in np.argsort(row)[::-1][:5]] for row in probabilities
    ]


def write_images(folder: Path, images: np.ndarray) -> None:
    """NCHW images in [-1, 1] (tanh outputs) -> PNG files, as seed 004 turns its output into a picture."""
    from PIL import Image

    folder.mkdir(parents=True, exist_ok=True)
    pixels = np.clip((images.astype(np.float64) + 1.0) / 2.0, 0.0, 1.0)
    for index, image in enumerate(pixels):
        Image.fromarray(np.round(image.transpose(1, 2, 0) * 255).astype(np.uint8)).save(folder / f"{index:03d}.png")


def timing_metrics(measurement: Measurement, examples_per_call: int) -> dict:
    metrics = measurement.stats()
    metrics["n_samples"] = len(measurement.samples_s)
    metrics["calls_per_sample"] = measurement.block_size
    if "time_median_s" in metrics and metrics["time_median_s"] > 0:
        metrics["throughput_per_s"] = examples_per_call / metrics["time_median_s"]
    return metrics


def memory_metrics(backend, device: str) -> dict:
    metrics = {"peak_host_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}
    peak_device = backend.peak_device_mb(device)
    if peak_device is not None:
        metrics["peak_device_mb"] = peak_device
    return metrics


def execute(
    cfg: DictConfig,
    run_dir: Path,
    parent_run_id: str | None = None,
    track: bool = True,
    before_timing: Callable[[], object] = lambda: None,
) -> Outcome:
    """Run a job and record it (result.json, tensors.h5, MLflow unless track=False) whatever its status."""
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    try:
        outcome = run_job(cfg, before_timing)
    except ConfigError as error:
        outcome = Outcome(status="FAILED", error=str(error))
    except MeasurementInterrupted as interrupt:
        outcome = Outcome(status="KILLED", error="interrupted by the user (Ctrl-C) while timing")
        outcome.metrics = timing_metrics(interrupt.measurement, 1)
        outcome.tensors = {"timings/samples_s": np.asarray(interrupt.measurement.samples_s)}
    except KeyboardInterrupt:
        outcome = Outcome(status="KILLED", error="interrupted by the user (Ctrl-C)")
    except Exception as error:  # a crash in the workload is a result to record, not to lose
        (run_dir / "error.log").write_text(traceback.format_exc())
        outcome = Outcome(status="FAILED", error=f"{type(error).__name__}: {error}".splitlines()[0])
    record(cfg, run_dir, outcome, parent_run_id, track)
    return outcome


def record(
    cfg: DictConfig, run_dir: Path, outcome: Outcome, parent_run_id: str | None = None, track: bool = True
) -> None:
    config = OmegaConf.to_container(cfg, resolve=True, enum_to_str=True)
    result = {
        "status": outcome.status,
        "config": config,
        "metrics": outcome.metrics,
        "environment": outcome.environment,
    }
    if outcome.error:
        result["error"] = outcome.error
    if outcome.warnings:
        result["warnings"] = outcome.warnings
    if outcome.predictions is not None:
        result["predictions"] = outcome.predictions
    tracking.write_result(run_dir, result)
    if outcome.images is not None:
        write_images(run_dir / "images", outcome.images)
    if outcome.tensors:
        attrs = {**choices(cfg), **outcome.attrs, "environment": outcome.environment}
        tracking.write_tensors(run_dir, outcome.tensors, attrs)
    if track and cfg.tracking.name == "mlflow":
        tracking.track(run_dir, cfg.tracking.uri, cfg.tracking.experiment, parent_run_id)


def print_summary(cfg: DictConfig, run_dir: Path, outcome: Outcome) -> None:
    """A few readable lines: what ran, how fast, how accurate, where the files are."""
    c = choices(cfg)
    device = outcome.environment.get("device", c["device"])
    print(f"{c['backend']} | {c['model']} | {c['task']} | {c['mode']} | {device} | {c['dtype']}: {outcome.status}")
    if outcome.error:
        print(f"error: {outcome.error}", file=sys.stderr)
    for label, value in summary_rows(outcome.metrics):
        print(f"  {label:<14}{value}")
    for warning in outcome.warnings:
        print(f"warning: {warning}", file=sys.stderr)
    print(f"  results in {run_dir}")


def summary_rows(m: dict) -> list[tuple[str, str]]:
    rows = []
    if "time_median_s" in m:
        spread = f"IQR {format_seconds(m['time_iqr_s'])}, min {format_seconds(m['time_min_s'])}"
        count = f"{m['n_samples']} samples x {m['calls_per_sample']} calls"
        rows.append(("median", f"{format_seconds(m['time_median_s'])}  ({spread}, {count})"))
        rows.append(("first call", format_seconds(m["first_call_s"])))
        rows.append(("throughput", f"{m.get('throughput_per_s', float('nan')):.4g} examples/s"))
    if "gflops_per_s" in m:
        rows.append(("GFLOP/s", f"{m['gflops_per_s']:.4g}"))
    if "max_abs_err_vs_reference" in m:
        errors = f"max abs {m['max_abs_err_vs_reference']:.3g}, max rel {m['max_rel_err_vs_reference']:.3g}"
        rows.append(("vs float64", errors))
    if "peak_device_mb" in m:
        rows.append(("device memory", f"{m['peak_device_mb']:.1f} MB peak"))
    return rows

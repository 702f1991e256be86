"""One job: check the config, run and time the task, record what happened whatever happened."""

from __future__ import annotations

import resource
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path

import numpy as np
from omegaconf import DictConfig, OmegaConf

from runner.config import ConfigError, check_combination, choices, first_line
from runner.result import Result
from runner.table import COLUMNS
from runner.timing import NOISY_REL_IQR, Measurement, MeasurementFailed, MeasurementInterrupted, ProgressLine, Turns

WEIGHTS_RECORD_LIMIT = 2_000_000  # weights are written to tensors.h5 when they have fewer elements


def run_job(cfg: DictConfig, before_timing: Callable[[], object] = lambda: None, turns: Turns | None = None) -> Result:
    """Run the configured measurement. Raises ConfigError for combinations that cannot run.

    `before_timing` is called once everything is set up, just before the first timed call; `turns`,
    where given, hands out the sampling in interleaved rounds (runner.rounds)."""
    check_combination(cfg)  # before any framework import
    c = choices(cfg)
    label = f"{c['backend']} {c['model']} {c['task']} {c['mode']}"
    with ProgressLine(label, max_time_s=float(cfg.timing.max_time_s)) as progress:
        return _run_job(cfg, c, before_timing, turns, progress)


def _run_job(
    cfg: DictConfig, c: dict, before_timing: Callable[[], object], turns: Turns | None, progress: ProgressLine
) -> Result:
    from runner import energy, environment, limits, machine_load
    from runner.backends import load_backend, numpy_backend
    from runner.data import load_inputs
    from runner.models import backend_for, build_workload, initial_weights
    from runner.tasks import build_task, errors_vs_reference, forward_outputs, reference_results
    from runner.timing import keep_freed_memory, measure

    timing = OmegaConf.to_container(cfg.timing)
    malloc_keeps_freed = timing.pop("keep_freed_memory") and keep_freed_memory()
    timing.pop("fixed_layout")  # the worker's start (runner.isolation) acted on it
    workload = build_workload(cfg.model)
    cost = limits.preflight(workload, cfg, c)  # refuses what cannot fit: before any allocation or framework import
    if cost:
        print(f"note: {cost}", file=sys.stderr, flush=True)
    progress.phase(f"importing {c['backend']}")
    backend = backend_for(workload, load_backend(cfg.backend.module))
    progress.phase("building the model and inputs")
    load_start = time.perf_counter()  # load_s: device start-up, weights built and placed on the device
    if cfg.threads is not None:
        backend.set_threads(int(cfg.threads))
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

    examples_per_call = workload.examples_per_call(cfg.batch_size)
    progress.phase("building the task (tracing where the mode compiles)")
    task_run = build_task(backend, workload, c["task"], c["mode"], device, params, inputs, constants)
    meter, energy_note = energy.meter_for(device)
    load = machine_load.MachineLoad.for_this_machine()
    progress.phase("waiting for the tracking store to open")
    before_timing()
    backend.reset_peak_memory(device)
    try:
        measurement, (first_output, results) = measure(
            task_run.step,
            backend.synchronizer(device),
            **timing,
            progress=progress,
            keep=lambda out: (out, task_run.results(out)),  # off the device before the next call reuses it
            energy=meter,
            turns=turns,
            load=load,
        )
    except (MeasurementInterrupted, MeasurementFailed) as stopped:
        stopped.examples_per_call = examples_per_call  # the record's throughput counts real examples
        stopped.machine_load = load.metrics() if load else {}
        raise
    progress.phase("checking against the float64 reference")

    result = Result(status="FINISHED")
    result.environment = environment.collect(backend.environment(device))
    result.environment["device"] = device
    result.environment["malloc_keeps_freed_memory"] = malloc_keeps_freed
    result.metrics = timing_metrics(measurement, examples_per_call)
    result.metrics["load_s"] = load_s
    result.metrics.update(load.metrics() if load else {})
    joules, energy_reason = energy.energy_metrics(measurement.energy_j, measurement.timed_calls(), examples_per_call)
    result.metrics.update(joules)
    result.environment.update({**energy_note, **energy_reason})
    result.metrics.update(memory_metrics(backend, device))
    if cfg.check_reference:
        reference = reference_results(workload, c["task"], c["mode"], params_held, inputs_held)
        result.metrics.update(errors_vs_reference(results, reference))
    if hasattr(workload, "flops_per_call") and "time_median_s" in result.metrics:
        result.metrics["gflops_per_s"] = workload.flops_per_call() / result.metrics["time_median_s"] / 1e9
    result.tensors = {f"inputs/{k}": v for k, v in inputs_held.items()}
    if sum(v.size for v in params_held.values()) <= WEIGHTS_RECORD_LIMIT:
        result.tensors.update({f"weights/{k}": v for k, v in params_held.items()})
    result.tensors.update(forward_outputs(backend, workload, state, inputs, results))
    result.tensors.update(results)
    result.tensors.update(sample_tensors(measurement))
    result.attrs = {
        **c,
        "device": device,
        "calls_per_sample": measurement.block_size,
        "batch_size": int(cfg.batch_size),
        "seed": int(cfg.seed),
        "stopped_by": measurement.stopped_by,
    }
    if hasattr(workload, "extra_metrics"):
        result.metrics.update(workload.extra_metrics(backend, state, inputs, first_output))
    if hasattr(workload, "interpret"):  # predictions or images, as the workload reads its outputs
        read = workload.interpret(result.tensors["outputs/y"])
        result.predictions, result.images = read.get("predictions"), read.get("images")
    result.warnings.extend(non_finite_warnings(result.tensors))
    if measurement.warmup_cut_short:
        result.attrs["warmup_cut_short"] = True
        result.warnings.append(
            f"warm-up cut short by timing.max_time_s={cfg.timing.max_time_s} after {measurement.warmup_calls} calls: "
            "the samples may include warm-up effects"
        )
    if cost:
        result.warnings.append(cost)
    busy = machine_load.busy_warning(result.metrics)
    if busy:
        result.warnings.append(busy)
    spread = measurement.turn_rel_iqr()
    if spread > NOISY_REL_IQR:
        where = "within its turns " if len(set(measurement.sample_rounds)) > 1 else ""
        result.warnings.append(
            f"noisy measurement: {where}IQR is {spread:.0%} of the median; raise timing.max_time_s or quiet the machine"
        )
    return result


def non_finite_warnings(tensors: dict[str, np.ndarray]) -> list[str]:
    """One warning per output or gradient that holds NaN or inf (from NaN inputs or weights, overflow, ...)."""
    warnings = []
    for name, array in tensors.items():
        array = np.asarray(array)
        if name.startswith(("outputs/", "gradients/")) and array.dtype.kind in "fc":
            bad = int(array.size - np.count_nonzero(np.isfinite(array)))
            if bad:
                warnings.append(f"{name} holds {bad} NaN or infinite values of {array.size}")
    return warnings


def stop_reason(interrupt: BaseException) -> str:
    """What stopped a job, for the record: SIGTERM arrives as KeyboardInterrupt("stopped by SIGTERM")
    (run.py and the worker's handler); a bare KeyboardInterrupt is Ctrl-C."""
    while interrupt is not None:
        if "SIGTERM" in str(interrupt):
            return "terminated (SIGTERM)"
        interrupt = interrupt.__cause__
    return "interrupted by the user (Ctrl-C)"


def timing_metrics(measurement: Measurement, examples_per_call: int) -> dict:
    metrics = measurement.stats()
    metrics["n_samples"] = len(measurement.samples_s)
    metrics["calls_per_sample"] = measurement.block_size
    if measurement.sample_rounds:
        metrics["n_rounds"] = len(set(measurement.sample_rounds))
    if "time_median_s" in metrics and metrics["time_median_s"] > 0:
        metrics["throughput_per_s"] = examples_per_call / metrics["time_median_s"]
    return metrics


def memory_metrics(backend, device: str) -> dict:
    metrics = {"peak_host_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}
    peak_device = backend.peak_device_mb(device)
    if peak_device is not None:
        metrics["peak_device_mb"] = peak_device
    return metrics


def run_and_record(
    cfg: DictConfig, run_dir: Path, before_timing: Callable[[], object] = lambda: None, turns: Turns | None = None
) -> Result:
    """Run a job in this process and write its run directory (result.json, tensors.h5), whatever its status."""
    started = time.time()  # MLflow is fed later, from the files: the run's span is recorded here
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    try:
        result = run_job(cfg, before_timing, turns)
    except ConfigError as error:
        result = Result(status="FAILED", error=str(error))
    except MeasurementInterrupted as interrupt:
        reason = f"{stop_reason(interrupt)} while timing"
        result = stopped_while_timing("KILLED", reason, interrupt.measurement, cfg, interrupt)
    except MeasurementFailed as failure:
        (run_dir / "error.log").write_text(traceback.format_exc())
        error = failure.__cause__
        reason = f"{type(error).__name__}: {first_line(error)} (while timing; the samples before it are kept)"
        result = stopped_while_timing("FAILED", reason, failure.measurement, cfg, failure)
    except KeyboardInterrupt as interrupt:
        result = Result(status="KILLED", error=stop_reason(interrupt))
    except Exception as error:  # a crash in the workload is a result to record, not to lose
        (run_dir / "error.log").write_text(traceback.format_exc())
        result = Result(status="FAILED", error=f"{type(error).__name__}: {first_line(error)}")
    result.started = started
    record(cfg, run_dir, result)
    return result


def sample_tensors(measurement: Measurement) -> dict[str, np.ndarray]:
    """Every sample (seconds per call), the round it was taken in, when it ended (Unix seconds) and the
    most runnable threads of other processes read during its turn (-1: not read)."""
    return {
        "timings/samples_s": np.asarray(measurement.samples_s),
        "timings/sample_round": np.asarray(measurement.sample_rounds, dtype=np.int64),
        "timings/sample_end_unix_s": np.asarray(measurement.sample_ends),
        "timings/sample_other_runnable": np.asarray(measurement.sample_others, dtype=np.int64),
    }


def stopped_while_timing(status: str, reason: str, measurement: Measurement, cfg: DictConfig, stopped=None) -> Result:
    """The record of a job stopped or failed while timing: the samples it took are kept. `stopped` (the
    exception, where there is one) knows the examples per call and how busy the machine was."""
    result = Result(status=status, error=reason)
    result.metrics = timing_metrics(measurement, getattr(stopped, "examples_per_call", cfg.batch_size))
    result.metrics.update(getattr(stopped, "machine_load", {}))
    result.tensors = sample_tensors(measurement)
    return result


def record(cfg: DictConfig, run_dir: Path, result: Result) -> None:
    """Write the run directory: the resolved config goes into result.json, the choices into tensors.h5."""
    result.config = OmegaConf.to_container(cfg, resolve=True, enum_to_str=True)
    result.ended = result.ended or time.time()
    result.attrs = {**choices(cfg), **result.attrs}
    result.write(run_dir)


def print_summary(cfg: DictConfig, run_dir: Path, result: Result) -> None:
    """A few readable lines: what ran, how fast, how accurate, where the files are."""
    c = choices(cfg)
    device = result.environment.get("device", c["device"])
    print(f"{c['backend']} | {c['model']} | {c['task']} | {c['mode']} | {device} | {c['dtype']}: {result.status}")
    if result.error:
        print(f"error: {result.error}", file=sys.stderr)
    for column in COLUMNS:
        cell = column.cell(result.metrics)
        if cell:
            print(f"  {column.label:<16}{cell}")
    for warning in result.warnings:
        print(f"warning: {warning}", file=sys.stderr)
    print(f"  results in {run_dir}")
    for line in tracking_lines(run_dir):
        print(line)


def tracking_lines(run_dir: Path) -> list[str]:
    """Where the run is in MLflow: its id and how to open it in the UI (from tracking.json)."""
    import json

    path = Path(run_dir) / "tracking.json"
    note = json.loads(path.read_text()) if path.exists() else {}
    if not note.get("run_id"):
        return []
    return [f"  MLflow run      {note['run_id']}", *ui_lines(note["uri"], f"#/runs/{note['run_id']}")]


def ui_lines(uri: str, fragment: str) -> list[str]:
    """How a person opens `fragment` of the MLflow UI for the store at `uri`."""
    if uri.startswith(("http://", "https://")):
        return [f"  open            {uri.rstrip('/')}/{fragment}"]
    return [
        f"  browse with     mlflow ui --backend-store-uri {uri}",
        f"  then open       http://127.0.0.1:5000/{fragment}",
    ]

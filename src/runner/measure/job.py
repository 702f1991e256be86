"""One job: check the config, run and time the task, record what happened whatever happened."""

from __future__ import annotations

import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from runner.config import ConfigError, check_combination, first_line
from runner.measure.figures import memory_metrics, non_finite_warnings, rate_time, series_metrics, timing_metrics
from runner.measure.progress import ProgressLine
from runner.measure.stop import stop_reason
from runner.measure.timing import (
    NOISY_REL_IQR,
    LoopSettings,
    Measurement,
    MeasurementFailed,
    MeasurementInterrupted,
    Turns,
)
from runner.record import job_record
from runner.record.result import ERROR_LOG, Result, Status
from runner.spec import JobSpec
from runner.tasks import Setup, Task, TaskRun, build_task

if TYPE_CHECKING:
    from runner.measure.samples import Series
    from runner.models import Workload

WEIGHTS_RECORD_LIMIT = 2_000_000  # weights are written to tensors.h5 when they have fewer elements


def run_job(
    spec: JobSpec,
    before_timing: Callable[[], object] = lambda: None,
    turns: Turns | None = None,
    profile_to: Path | None = None,
) -> Result:
    """Run the job's measurement (its combination checked already: runner.config.check_combination).

    `before_timing` is called once everything is set up, just before the first timed call; `turns`,
    where given, hands out the sampling in interleaved rounds (runner.launch.rounds); `profile_to`: the run
    directory its call's profile goes to after the timing (timing.profile, runner.measure.profile)."""
    label = f"{spec.backend} {spec.model} {spec.task} {spec.mode}"
    with ProgressLine(label, max_time_s=float(spec.timing.max_time_s)) as progress:
        return _run_job(spec, before_timing, turns, progress, profile_to)


@dataclass
class Prepared:
    """A job set up for timing: its workload on its backend, weights and inputs placed, the task built."""

    spec: JobSpec
    choices: dict
    workload: Workload
    backend: ModuleType  # a runner.backends module
    device: str
    state: dict  # every weight, as the backend holds it
    inputs: dict
    params_held: dict  # weights and inputs as held, back in numpy: the reference starts from them
    inputs_held: dict
    examples_per_call: int
    task: Task
    setup: Setup  # what the task was built from
    task_run: TaskRun
    load_s: float
    cost: str | None  # the up-front cost note (runner.measure.limits)
    malloc_keeps_freed: bool
    loop: LoopSettings  # what measure()'s loop obeys, from timing.*
    series: dict[str, Series]  # timing.series' and the task's, built (runner.measure.samples)
    precision_env: dict  # what Backend.set_precision configured: the policy, the matmul precision reported


def _run_job(
    spec: JobSpec,
    before_timing: Callable[[], object],
    turns: Turns | None,
    progress: ProgressLine,
    profile_to: Path | None = None,
) -> Result:
    job = _prepare(spec, progress)
    measurement, first_output, results, meter_note = _measure(job, before_timing, turns, progress)
    if profile_to is not None:
        from runner.measure import profile

        progress.phase("profiling the call (timing.profile)")
        sync = job.backend.synchronizer(job.device)
        profile.record(job.task_run.step, sync, Path(profile_to), spec.backend, job.device)
    progress.phase("checking against the float64 reference")
    return _assemble(job, measurement, first_output, results, meter_note)


def _prepare(spec: JobSpec, progress: ProgressLine) -> Prepared:
    from runner.measure import limits
    from runner.measure.data import load_inputs, place_input
    from runner.measure.malloc import keep_freed_memory
    from runner.measure.samples import build_series
    from runner.models import build_workload, check_known_wrong

    c = spec.choices()
    # timing.fixed_layout: the worker's start acted on it (runner.launch.isolation); timing.resolve: the sweep's
    # coordinator acts on it (runner.launch.rounds); timing.poll_idle: _measure holds it around measure()
    malloc_keeps_freed = spec.timing.keep_freed_memory and keep_freed_memory()
    series = build_series(spec.timing.series)
    workload = build_workload(spec.model_settings)
    task = build_task(spec.task_settings)
    check_known_wrong(spec.model_settings, c)  # before the framework is imported
    task.check(workload)
    backend, device, precision_env, start_s = _start_backend(spec, workload, progress)
    cost = limits.check_fits(workload, spec, device, task)  # refuses what cannot fit: before any allocation
    if cost:
        print(f"note: {cost}", file=sys.stderr, flush=True)
    progress.phase("building the model and inputs")
    rng = np.random.default_rng(spec.seed)
    state, weights_s = _place_weights(spec, workload, backend, device, rng)
    inputs64 = load_inputs(spec.data_settings, workload, rng, spec.batch_size)
    inputs = {k: place_input(backend, v, device, c["dtype"]) for k, v in inputs64.items()}
    params = {k: v for k, v in state.items() if workload.trainable(k)}
    constants = {k: v for k, v in state.items() if not workload.trainable(k)}  # e.g. batch-norm running statistics
    progress.phase("building the task (tracing where the mode compiles)")
    setup = Setup(
        backend, workload, c["mode"], device, params, inputs, constants, spec.per_example, spec.precision, c["dtype"],
        machine_facts(task.machine_facts, device),
    )  # fmt: skip
    task_run = task.build(setup)
    series.update(task_run.series)
    return Prepared(
        spec=spec,
        choices=c,
        workload=workload,
        backend=backend,
        device=device,
        state=state,
        inputs=inputs,
        # what the backend really holds (rounded to dtype): the reference starts from the same values
        params_held={k: backend.from_native_layout(backend.to_numpy(v)) for k, v in state.items()},
        inputs_held={k: backend.to_numpy(v) for k, v in inputs.items()},
        examples_per_call=workload.examples_per_call(spec.batch_size),
        task=task,
        setup=setup,
        task_run=task_run,
        load_s=start_s + weights_s,
        cost=cost,
        malloc_keeps_freed=malloc_keeps_freed,
        loop=LoopSettings.of(spec.timing),
        series=series,
        precision_env=precision_env,
    )


def _start_backend(spec: JobSpec, workload, progress: ProgressLine) -> tuple[ModuleType, str, dict, float]:
    """The backend imported and configured: (backend, the device it resolved, what its precision policy set, seconds
    the device start-up took)."""
    from runner.backends import load_backend, share_gpu_memory
    from runner.models import backend_for

    share_gpu_memory(spec.device)
    progress.phase(f"importing {spec.backend}")
    backend = backend_for(workload, load_backend(spec.backend_module))
    start = time.perf_counter()
    if spec.threads is not None:
        backend.set_threads(spec.threads)
    device = backend.prepare(spec.device, spec.dtype)  # the one place device=auto is resolved
    precision_env = backend.set_precision(spec.precision, device)
    return backend, device, precision_env, time.perf_counter() - start


def _place_weights(spec: JobSpec, workload, backend, device: str, rng) -> tuple[dict, float]:
    """Every weight as the backend holds it (host-side ones in numpy), and the seconds placing them took."""
    from runner.backends import numpy_backend
    from runner.models import initial_weights

    start = time.perf_counter()
    params64 = initial_weights(spec.model_settings, workload, rng)
    host = workload.host_params
    state = {
        k: numpy_backend.asarray(v, "cpu", spec.dtype)
        if k in host
        else backend.asarray(backend.to_native_layout(v), device, spec.dtype)
        for k, v in params64.items()
    }
    backend.synchronizer(device)()
    return state, time.perf_counter() - start


def _measure(job: Prepared, before_timing: Callable[[], object], turns: Turns | None, progress: ProgressLine):
    """Time the task; (measurement, first output, results, what the environment records of the meters)."""
    from runner.backends import first_call
    from runner.measure import energy, idle_poll
    from runner.measure.timing import measure

    meter, energy_note = energy.meter_for(job.device)
    progress.phase("waiting for the tracking store to open")
    before_timing()
    job.backend.reset_peak_memory(job.device)
    try:
        with idle_poll.polling(job.spec.timing.poll_idle) as idle_note:
            meter_note = {**energy_note, **idle_note}  # what the environment records of both
            measurement, kept = measure(
                job.task_run.step,
                job.backend.synchronizer(job.device),
                job.loop,
                progress=progress,
                keep=lambda out: (out, job.task_run.results(out)),  # off the device before the next call reuses it
                energy=meter,
                turns=turns,
                series=job.series,
                own_thread=job.spec.records_caller_stack,
                parts=lambda: first_call.parts_of(job.backend),
            )
    except (MeasurementInterrupted, MeasurementFailed) as stopped:
        stopped.examples_per_call = job.examples_per_call  # the record's throughput counts real examples
        stopped.series_metrics = series_metrics(job.series, stopped.measurement)
        raise
    first_output, results = cast(tuple[Any, dict], kept)  # what `keep` returned for the first call
    return measurement, first_output, results, meter_note


def _assemble(job: Prepared, measurement: Measurement, first_output, results: dict, meter_note: dict) -> Result:
    """The record: environment, metrics, tensors, attributes and warnings, each from its own collector."""
    result = Result(status=Status.FINISHED)
    result.environment = _environment(job, meter_note)
    result.metrics = _metrics(job, measurement, results, first_output)
    joules, energy_reason = _energy(job, measurement, meter_note.get("gpu_power_limit_w"))
    result.metrics.update(joules)
    result.environment.update(energy_reason)
    result.tensors = _tensors(job, measurement, results)
    result.attrs = _attributes(job, measurement)
    outputs = result.tensors.get("outputs/y")
    read = job.workload.interpret(outputs) if outputs is not None else {}  # predictions or images
    result.predictions, result.images = read.get("predictions"), read.get("images")
    result.warnings = _warnings(job, measurement, result)
    return result


def machine_facts(asked: tuple[str, ...], device: str) -> dict:
    """The facts of the machine a task asked for (runner.tasks.Task.machine_facts), where they can be had: the host
    memory's bandwidth on device=cpu (measured once per kind of machine), the GPU's peak on cuda (NVML's figure)."""
    if "memory_bandwidth" not in asked:
        return {}
    from runner.measure import bandwidth

    figure = bandwidth.machine_bandwidth() if device == "cpu" else {}
    figure = bandwidth.gpu_peak_bandwidth() if device == "cuda" else figure
    return {"memory_bandwidth": figure} if "GBps" in figure else {}


def _environment(job: Prepared, meter_note: dict) -> dict:
    from runner.record import environment

    env = environment.collect(job.backend.environment(job.device))
    env["device"] = job.device
    env["malloc_keeps_freed_memory"] = job.malloc_keeps_freed
    env.update(precision=job.spec.precision, **job.precision_env)
    env.update(job.workload.describe(job.backend, job.state, job.inputs, job.task.backward))
    env.update(job.task.describe(job.setup))
    if job.spec.environment is not None:  # another Python environment than the runner's own: its resolved set
        env.update(job.spec.environment.record(), python_environment_python=sys.executable)  # the worker's own
    return {**env, **meter_note}


def _energy(job: Prepared, measurement: Measurement, power_limit_w: float | None) -> tuple[dict, dict]:
    from runner.measure import energy

    calls, seconds = measurement.timed_calls(), measurement.timed_s()
    return energy.energy_metrics(measurement.energy_j, calls, job.examples_per_call, seconds, power_limit_w)


def _metrics(job: Prepared, measurement: Measurement, results: dict, first_output) -> dict:
    from runner import precision

    metrics = timing_metrics(measurement, job.examples_per_call)
    metrics["load_s"] = job.load_s
    metrics.update(series_metrics(job.series, measurement))
    metrics.update(memory_metrics(job.backend, job.device))
    if job.spec.check_reference and job.workload.numpy_reference:
        metrics.update(job.task.agreement(job.setup, job.params_held, job.inputs_held, results))
        metrics.update(precision.tolerance_metrics(metrics, job.spec.dtype, job.spec.precision, job.device))
    flops, call_s = job.workload.flops_per_call(), rate_time(metrics)
    if flops and call_s:
        metrics["gflops_per_s"] = flops / call_s / 1e9
    if call_s:
        metrics.update(job.task.metrics(call_s, measurement.samples.columns))
    metrics.update(job.workload.extra_metrics(job.backend, job.state, job.inputs, first_output))
    return metrics


def _tensors(job: Prepared, measurement: Measurement, results: dict) -> dict:
    from runner.tasks import forward_outputs

    tensors = {f"inputs/{k}": v for k, v in job.inputs_held.items()}
    if sum(v.size for v in job.params_held.values()) <= WEIGHTS_RECORD_LIMIT:
        tensors.update({f"weights/{k}": v for k, v in job.params_held.items()})
    tensors.update(forward_outputs(job.setup, job.state, job.inputs, results))
    tensors.update(results)
    tensors.update(measurement.samples.tensors())
    return tensors


def _attributes(job: Prepared, measurement: Measurement) -> dict:
    attrs = {
        **job.choices,
        "device": job.device,
        "calls_per_sample": measurement.block_size,
        "batch_size": job.spec.batch_size,
        "seed": job.spec.seed,
        "stopped_by": measurement.stopped_by,
    }
    if measurement.warmup_cut_short:
        attrs["warmup_cut_short"] = True
    return attrs


def _warnings(job: Prepared, measurement: Measurement, result: Result) -> list[str]:
    from runner.measure import idle_poll, machine_load

    warnings = non_finite_warnings(result.tensors) + job.task_run.warnings()
    if measurement.warmup_cut_short:
        warnings.append(
            f"warm-up cut short by timing.max_time_s={job.spec.timing.max_time_s} after {measurement.warmup_calls} "
            "calls: the samples may include warm-up effects"
        )
    if job.cost:
        warnings.append(job.cost)
    if why := result.environment.get("cpu_idle_poll_unavailable_reason"):
        warnings.append(f"timing.poll_idle: the CPUs idled as usual ({why}; root only, Linux only)")
    busy = machine_load.busy_warning(result.metrics)
    if busy:
        warnings.append(busy)
    spread = measurement.turn_rel_iqr()
    if spread > NOISY_REL_IQR:
        where = "within its turns " if len(set(measurement.samples.rounds)) > 1 else ""
        hint = idle_poll.waking_hint(job.spec.threads, job.spec.timing.poll_idle) if job.device == "cpu" else ""
        warnings.append(
            f"noisy measurement: {where}IQR is {spread:.0%} of the median; raise timing.max_time_s or quiet the machine"
            + hint
        )
    return warnings


def run_and_record(
    spec: JobSpec, run_dir: Path, before_timing: Callable[[], object] = lambda: None, turns: Turns | None = None
) -> Result:
    """Run a job in this process and write its run directory (result.json, tensors.h5), whatever its status.
    The combination rules refuse its spec here, recorded FAILED."""
    started = time.time()  # MLflow is fed later, from the files: the run's span is recorded here
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    try:
        check_combination(spec.config)  # before any framework import
        result = run_job(spec, before_timing, turns, run_dir if spec.timing.profile else None)
    except ConfigError as error:
        result = Result(status=Status.FAILED, error=str(error))
    except MeasurementInterrupted as interrupt:
        reason = f"{stop_reason(interrupt)} while timing"
        result = stopped_while_timing(Status.KILLED, reason, interrupt.measurement, spec.batch_size, interrupt)
        result.stopped_by = stop_reason(interrupt)
    except MeasurementFailed as failure:
        (run_dir / ERROR_LOG).write_text(traceback.format_exc())
        cause = failure.__cause__ or failure  # raised from the error that stopped the timing (runner.measure.timing)
        reason = f"{type(cause).__name__}: {first_line(cause)} (while timing; the samples before it are kept)"
        result = stopped_while_timing(Status.FAILED, reason, failure.measurement, spec.batch_size, failure)
    except KeyboardInterrupt as interrupt:
        result = Result(status=Status.KILLED, error=stop_reason(interrupt))
        result.stopped_by = stop_reason(interrupt)
    except Exception as error:  # a crash in the workload is a result to record, not to lose
        (run_dir / ERROR_LOG).write_text(traceback.format_exc())
        result = Result(status=Status.FAILED, error=f"{type(error).__name__}: {first_line(error)}")
    result.started = started
    job_record.write(spec, run_dir, result)
    return result


def stopped_while_timing(
    status: Status,
    reason: str,
    measurement: Measurement,
    batch_size: int,
    stopped: MeasurementInterrupted | MeasurementFailed | None = None,
) -> Result:
    """The record of a job stopped or failed while timing: the samples it took are kept. `stopped` (the
    exception, where there is one) knows the examples per call (else the batch's) and the per-sample series'
    metrics."""
    result = Result(status=status, error=reason)
    examples = stopped.examples_per_call if stopped and stopped.examples_per_call else batch_size
    result.metrics = timing_metrics(measurement, examples)
    result.metrics.update(stopped.series_metrics if stopped else {})
    result.tensors = measurement.samples.tensors()
    return result

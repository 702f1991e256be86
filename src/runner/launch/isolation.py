"""Run a job inline or in a fresh spawned worker process, and record it whatever becomes of the worker.

With `isolation=process` the worker measures and writes result.json + tensors.h5; this process
(the Hydra job) then logs the run directory to MLflow, so the worker never pays for importing MLflow.
A worker that dies (a signal, the OOM killer, a hard exit) leaves a FAILED result.json written here,
with the reason and the tail of its output (`job.log`).

Nothing is lost when this process dies instead: a pending tracking.json is written before the job
starts (so `runner sync RUN_DIR` can upload whatever the directory holds), and the worker never
outlives this process for long: the kernel sends it SIGTERM when its parent dies (Linux), a watchdog
thread notices a new parent elsewhere, and on SIGTERM it records KILLED with the samples it took.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import os
import shutil
import signal
import threading
from dataclasses import replace
from pathlib import Path

from runner import tracking
from runner.launch.fork_server import ForkServer, ForkServerGone, WorkerProcess
from runner.launch.interpreter import spawning_from
from runner.launch.job_log import LogForwarder
from runner.launch.messages import Dismissed, MayTime
from runner.launch.sweep_lines import in_sweep
from runner.launch.worker import GRACE_S, start, start_fixed, worker_main
from runner.measure.stop import StopReason
from runner.measure.timing import Measurement
from runner.record import job_record
from runner.record.result import ERROR_LOG, IMAGES_DIR, LOG_FILE, RESULT_FILE, TENSORS_FILE, Result, Status
from runner.spec import JobSpec, environment_settings, is_project_environment

log = logging.getLogger(__name__)

# What a previous run in the same directory may have left: never uploaded as this run's.
STALE = (RESULT_FILE, TENSORS_FILE, IMAGES_DIR, tracking.TRACKING_FILE, ERROR_LOG, LOG_FILE)


def execute(spec: JobSpec, run_dir: Path, parent_run_id: str | None = None) -> Result:
    """Run and record one job as `spec.isolation` says, then log it to MLflow; returns its record."""
    prepare(spec, run_dir, parent_run_id)
    if spec.isolation == "inline":
        from runner.measure.job import run_and_record

        result = run_and_record(spec, Path(run_dir))
    else:
        worker = Worker(spec, Path(run_dir))
        worker.start()
        result = worker.join()
    return complete(spec, run_dir, parent_run_id, result)


def start_server(isolation: str, fixed_layout: bool, backend_module: str, environment: dict | None = None) -> None:
    """Start the fork server the job's worker will come from (Worker.start), so that it imports while Hydra composes
    (or hand the spare its backend: runner.launch.worker.start_spare_server); end the spare where the job has no use
    for it: one in another Python environment (`environment`, environment.*) has a server of that environment's."""
    settings = environment_settings(environment)
    if isolation == "process" and fixed_layout:
        python = None
        if not is_project_environment(settings):
            from runner.launch import environments

            python = environments.ready(settings, say=log.info)  # built by the preflight: looked up
        with contextlib.suppress(ForkServerGone, OSError):  # Worker.start tries again, or spawns
            ForkServer.for_backend(backend_module, worker_main, start_fixed, python)
    ForkServer.stop_spare()


def prepare(spec: JobSpec, run_dir: Path, parent_run_id: str | None) -> None:
    """An empty run directory with a pending tracking.json, so `runner sync` can upload whatever it will hold."""
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    clear_stale(run_dir)
    if store := spec.mlflow_store():
        tracking.write_pending(run_dir, *store, parent_run_id)


def complete(spec: JobSpec, run_dir: Path, parent_run_id: str | None, result: Result) -> Result:
    """After the job: the tail of its output into a failed record, then the run into MLflow."""
    if result.status != Status.FINISHED:
        result = job_record.add_output_tail(Path(run_dir), result)
    if store := spec.mlflow_store():
        tracking.track(Path(run_dir), *store, parent_run_id)
    return result


def clear_stale(run_dir: Path) -> None:
    """Remove what an earlier run left in this directory (links are removed, never followed)."""
    for name in STALE:
        path = run_dir / name
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        elif path.exists() or path.is_symlink():
            path.unlink()


class Worker:
    """A job's worker process, with its output forwarded to this process's stderr.

    The worker is forked by its backend's fork server (runner.launch.fork_server), or spawned afresh where each job
    must draw its own memory layout (timing.fixed_layout=false). It talks to this process over `connection`:
    it times nothing before ("may_time",) arrives (the MLflow store is open), and with `turns=True` it sets up
    and warms up, says so, and then samples only in the turns it is given (runner.launch.rounds hands them out);
    else it measures in one go."""

    def __init__(self, spec: JobSpec, run_dir: Path, turns: bool = False):
        self.spec, self.run_dir, self.turns = in_its_environment(spec), run_dir, turns
        self.connection, self._worker_end = multiprocessing.Pipe()
        self.log_path = run_dir / LOG_FILE
        self.log_path.touch()
        self.process: WorkerProcess  # by start()
        self.forwarder = LogForwarder(self.log_path, quiet=in_sweep())

    def start(self) -> None:
        args = (self.spec, str(self.run_dir), str(self.log_path), self.turns)
        _open_store_meanwhile(self.spec, self.connection)
        self.forwarder.start()
        process: WorkerProcess | None = None
        fixed = self.spec.timing.fixed_layout
        if fixed:
            with contextlib.suppress(ForkServerGone):
                environment = self.spec.environment
                server = ForkServer.for_backend(self.spec.backend_module, worker_main, start_fixed, environment)
                process = server.fork(args, self._worker_end)
        if process is None:
            with spawning_from(self.spec.environment):
                process = _spawn(args, self._worker_end, fixed=fixed)
        self.process = process
        self._worker_end.close()

    def join(self) -> Result:
        """Wait for the worker to end (on Ctrl-C or SIGTERM: stop it), then return what it recorded."""
        try:
            self.process.join()
        except KeyboardInterrupt as interrupt:
            from runner.measure.stop import stop_reason

            return self.stop(stop_reason(interrupt))
        return self.recorded(Status.FAILED, _exit_reason(self.process.exitcode))

    def stop(self, reason: StopReason, measurement: Measurement | None = None) -> Result:
        """Let the worker record what it measured (it got Ctrl-C too, or gets `reason`'s signal now), then end it."""
        if self.process.is_alive():  # a Ctrl-C at the terminal reached it too; a `kill` of ours did not
            with contextlib.suppress(ProcessLookupError):  # it ended, and its fork server has not said so yet
                os.kill(self.pid, reason.signal)
        try:
            self.process.join(GRACE_S)
        except KeyboardInterrupt:  # a second Ctrl-C: stop now
            pass
        if self.process.is_alive():
            self.process.kill()
            self.process.join()
        result = self.recorded(Status.KILLED, f"{reason} before the worker recorded it", measurement)
        result.stopped_by = reason
        return result

    def dismiss(self) -> None:
        """End one of a job's other processes (timing.processes), which records nothing, and remove its directory."""
        with contextlib.suppress(OSError):  # it is gone already
            self.connection.send(Dismissed())
        self.process.join(GRACE_S)
        if self.process.is_alive():
            self.process.kill()
            self.process.join()
        self.forwarder.stop()
        self._release()
        shutil.rmtree(self.run_dir, ignore_errors=True)

    def recorded(self, status: Status, reason: str, measurement: Measurement | None = None) -> Result:
        """What the worker recorded, or (when it recorded nothing) a record written here with `reason` and
        the samples it reported (`measurement`)."""
        self.forwarder.stop()
        self._release()
        if Result.exists(self.run_dir):
            return Result.load(self.run_dir)
        from runner.measure.job import stopped_while_timing

        if measurement is not None and measurement.samples_s:
            kept = f"{reason} (the samples it reported are kept)"
            result = stopped_while_timing(status, kept, measurement, self.spec.batch_size)
        else:
            result = Result(status=status, error=reason)
        job_record.write(self.spec, self.run_dir, result)
        return result

    def exit_reason(self) -> str:
        return _exit_reason(self.process.exitcode)

    @property
    def pid(self) -> int:
        """The worker's process id, which it has from start() on."""
        pid = self.process.pid
        assert pid is not None, "the worker has not started"
        return pid

    def _release(self) -> None:
        """The pipe and the process's handles, once it has ended: a long sweep must not run out of files."""
        self.connection.close()
        with contextlib.suppress(ValueError):  # still running: Process.close refuses, and keeps them
            self.process.close()


def in_its_environment(spec: JobSpec) -> JobSpec:
    """The spec with the Python environment its environment.* asks for (runner.launch.environments builds it where
    it is not built yet; the launch's preflight has)."""
    if spec.environment is not None or is_project_environment(spec.environment_settings or environment_settings({})):
        return spec
    from runner.launch import environments

    return replace(spec, environment=environments.ready(spec.environment_settings, say=log.info))


def _open_store_meanwhile(spec: JobSpec, connection) -> None:
    """Import MLflow and open its store (the slow part of logging: BENCHMARKS.md) while the worker imports its
    framework and builds its inputs; the worker waits for MayTime on `connection` so that nothing here runs
    beside its timed calls."""
    store = spec.mlflow_store()
    if store is None:
        _tell_may_time(connection)
        return

    def open_store() -> None:
        try:
            tracking.open_store(store[0])
        except Exception:  # noqa: S110 - tracking.track reports a store that cannot open, after the job
            pass
        finally:
            _tell_may_time(connection)

    threading.Thread(target=open_store, name="open-mlflow-store", daemon=True).start()


def _tell_may_time(connection) -> None:
    with contextlib.suppress(OSError):  # the worker is gone already
        connection.send(MayTime())


def _spawn(args: tuple, connection, fixed: bool):
    """A worker in a fresh interpreter: what each job gets where it must draw a memory layout of its own."""
    context = multiprocessing.get_context("spawn")
    process = context.Process(target=worker_main, args=args, kwargs={"connection": connection})
    process.name = f"runner-job-{Path(args[1]).name}"
    if fixed:
        start_fixed(process)
    else:
        start(process)
    return process


def _exit_reason(exitcode: int | None) -> str:
    if exitcode is not None and exitcode < 0:
        name = signal.Signals(-exitcode).name
        hint = " (out of memory? the kernel's OOM killer sends SIGKILL)" if name == "SIGKILL" else ""
        return f"the worker process was killed by signal {name}{hint}"
    return f"the worker process exited with code {exitcode} before recording a result"

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
import ctypes
import multiprocessing
import os
import shutil
import signal
import sys
import threading
import time
from io import TextIOWrapper
from pathlib import Path
from typing import cast

from omegaconf import DictConfig, OmegaConf

from runner import tracking
from runner.launch.fork_server import ForkServer, ForkServerGone, WorkerProcess
from runner.launch.job_log import LogForwarder
from runner.launch.messages import Dismissed, Finished, MayTime, Ready, Turn, TurnDone
from runner.launch.sweep_lines import in_sweep
from runner.measure.stop import SIGTERM, Stopped, StopReason
from runner.measure.timing import Measurement
from runner.record import job_record
from runner.record.environment import ADDR_NO_RANDOMIZE
from runner.record.naming import job_spec, resolved_keeping_copies
from runner.record.result import ERROR_LOG, IMAGES_DIR, LOG_FILE, RESULT_FILE, TENSORS_FILE, Result, Status

GRACE_S = 30.0  # after Ctrl-C, how long the worker may take to record its samples
STORE_WAIT_S = 120.0  # the longest a worker waits for its parent to open the MLflow store before timing
WATCHDOG_S = 1.0  # how often the worker checks that its launcher is alive
PR_SET_PDEATHSIG = 1  # linux/prctl.h
PR_SET_NAME = 15
PERSONALITY_QUERY = 0xFFFFFFFF  # personality(2): read the persona, change nothing
# What a previous run in the same directory may have left: never uploaded as this run's.
STALE = (RESULT_FILE, TENSORS_FILE, IMAGES_DIR, tracking.TRACKING_FILE, ERROR_LOG, LOG_FILE)


def execute(cfg: DictConfig, run_dir: Path, parent_run_id: str | None = None) -> Result:
    """Run and record one job as `cfg.isolation` says, then log it to MLflow; returns its record."""
    prepare(cfg, run_dir, parent_run_id)
    if str(cfg.isolation) == "inline":
        from runner.measure.job import run_and_record

        result = run_and_record(cfg, Path(run_dir))
    else:
        worker = Worker(cfg, Path(run_dir))
        worker.start()
        result = worker.join()
    return complete(cfg, run_dir, parent_run_id, result)


def start_server(cfg: DictConfig) -> None:
    """Start the fork server the job's worker will come from (Worker.start), so that it imports while Hydra composes."""
    if str(cfg.isolation) == "process" and cfg.timing.fixed_layout:
        with contextlib.suppress(ForkServerGone, OSError):  # Worker.start tries again, or spawns
            ForkServer.for_backend(str(cfg.backend.module), worker_main, _start_fixed)


def prepare(cfg: DictConfig, run_dir: Path, parent_run_id: str | None) -> None:
    """An empty run directory with a pending tracking.json, so `runner sync` can upload whatever it will hold."""
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    clear_stale(run_dir)
    if cfg.tracking.name == "mlflow":
        tracking.write_pending(run_dir, cfg.tracking.uri, cfg.tracking.experiment, parent_run_id)


def complete(cfg: DictConfig, run_dir: Path, parent_run_id: str | None, result: Result) -> Result:
    """After the job: the tail of its output into a failed record, then the run into MLflow."""
    if result.status != Status.FINISHED:
        result = job_record.add_output_tail(Path(run_dir), result)
    if cfg.tracking.name == "mlflow":
        tracking.track(Path(run_dir), cfg.tracking.uri, cfg.tracking.experiment, parent_run_id)
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

    def __init__(self, cfg: DictConfig, run_dir: Path, turns: bool = False):
        self.cfg, self.run_dir, self.turns = cfg, run_dir, turns
        self.connection, self._worker_end = multiprocessing.Pipe()
        self.log_path = run_dir / LOG_FILE
        self.log_path.touch()
        self.process: WorkerProcess  # by start()
        self.forwarder = LogForwarder(self.log_path, quiet=in_sweep())

    def start(self) -> None:
        config = resolved_keeping_copies(self.cfg)  # the worker records which keys copy another
        args = (config, str(self.run_dir), str(self.log_path), self.turns)
        _open_store_meanwhile(self.cfg, self.connection)
        self.forwarder.start()
        process: WorkerProcess | None = None
        if self.cfg.timing.fixed_layout:
            with contextlib.suppress(ForkServerGone):
                server = ForkServer.for_backend(self.cfg.backend.module, worker_main, _start_fixed)
                process = server.fork(args, self._worker_end)
        if process is None:
            process = _spawn(args, self._worker_end, fixed=bool(self.cfg.timing.fixed_layout))
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

        spec = job_spec(self.cfg)
        if measurement is not None and measurement.samples_s:
            kept = f"{reason} (the samples it reported are kept)"
            result = stopped_while_timing(status, kept, measurement, spec.batch_size)
        else:
            result = Result(status=status, error=reason)
        job_record.write(spec, self.run_dir, result)
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


class PipeTurns:
    """In the worker: the `timing.Turns` a coordinator hands out over a pipe (runner.launch.rounds)."""

    def __init__(self, connection):
        self.connection = connection
        self.finished: Finished | None = None

    def ready(self, measurement: Measurement, rounds: int, processes: int) -> None:
        self.connection.send(Ready(measurement.first_call_s, measurement.block_size, rounds, processes))

    def wait(self) -> int | None:
        try:
            message = self.connection.recv()
            while isinstance(message, MayTime):  # the store opened later than the worker stopped waiting for it
                message = self.connection.recv()
        except (EOFError, ConnectionResetError):  # the launcher is gone; its death signal is on its way
            raise Stopped(SIGTERM) from None  # the launcher is gone: its death signal is on its way
        if isinstance(message, Dismissed):  # one of the job's other processes: its turns are all it had to give
            os._exit(0)
        self.finished = message if isinstance(message, Finished) else None
        return message.round if isinstance(message, Turn) else None

    def done(self, samples: dict[str, list]) -> None:
        self.connection.send(TurnDone(samples))

    def job_samples(self) -> dict[str, list] | None:
        return None if self.finished is None else self.finished.samples


def _open_store_meanwhile(cfg: DictConfig, connection) -> None:
    """Import MLflow and open its store (the slow part of logging: BENCHMARKS.md) while the worker imports its
    framework and builds its inputs; the worker waits for MayTime on `connection` so that nothing here runs
    beside its timed calls."""
    if cfg.tracking.name != "mlflow":
        _tell_may_time(connection)
        return

    def open_store() -> None:
        try:
            tracking.open_store(cfg.tracking.uri)
        except Exception:  # noqa: S110 - tracking.track reports a store that cannot open, after the job
            pass
        finally:
            _tell_may_time(connection)

    threading.Thread(target=open_store, name="open-mlflow-store", daemon=True).start()


def _tell_may_time(connection) -> None:
    with contextlib.suppress(OSError):  # the worker is gone already
        connection.send(MayTime())


def _wait_may_time(connection) -> None:
    """In the worker, before its first timed call: until the launcher says MayTime, at most STORE_WAIT_S."""
    if connection.poll(STORE_WAIT_S):
        message = connection.recv()
        assert isinstance(message, MayTime), message


def _spawn(args: tuple, connection, fixed: bool):
    """A worker in a fresh interpreter: what each job gets where it must draw a memory layout of its own."""
    context = multiprocessing.get_context("spawn")
    process = context.Process(target=worker_main, args=args, kwargs={"connection": connection})
    process.name = f"runner-job-{Path(args[1]).name}"
    if fixed:
        _start_fixed(process)
    else:
        _start(process)
    return process


def _start_fixed(process) -> None:
    with _fixed_layout():
        _start(process)


def _start(worker) -> None:
    """Start the worker, also from a joblib (loky) worker, whose start method a fresh Python cannot know."""
    method = multiprocessing.get_start_method(allow_none=True)
    foreign = method not in (None, *multiprocessing.get_all_start_methods())
    if foreign:  # the child would be told to use it, and fail
        multiprocessing.set_start_method(None, force=True)
    try:
        worker.start()
    finally:
        if foreign:
            multiprocessing.set_start_method(method, force=True)


@contextlib.contextmanager
def _fixed_layout():
    """Processes started meanwhile get the same memory layout every time (Linux: address-space randomization
    off, as `setarch -R` does; the persona is inherited across exec). Each randomized layout is a draw of its
    own: identical torch jobs in fresh processes came out up to 1.18x apart, 1.03x with a fixed layout
    (BENCHMARKS.md). Where the kernel refuses, the layout stays random: the record says which
    (environment.layout_randomized)."""
    libc = ctypes.CDLL(None, use_errno=True)
    persona = getattr(libc, "personality", None)
    before = persona(PERSONALITY_QUERY) if persona is not None else -1
    changed = before != -1 and persona(before | ADDR_NO_RANDOMIZE) != -1
    try:
        yield
    finally:
        if changed:
            persona(before)


def _exit_reason(exitcode: int | None) -> str:
    if exitcode is not None and exitcode < 0:
        name = signal.Signals(-exitcode).name
        hint = " (out of memory? the kernel's OOM killer sends SIGKILL)" if name == "SIGKILL" else ""
        return f"the worker process was killed by signal {name}{hint}"
    return f"the worker process exited with code {exitcode} before recording a result"


def worker_main(
    config: dict, run_dir: str, log_path: str, turns: bool, connection=None, parent: int | None = None
) -> None:
    """In the worker (spawned, or forked by runner.launch.fork_server whose pid is `parent`): all output to job.log,
    measure, write result.json + tensors.h5."""
    log = open(log_path, "a", buffering=1)  # stays open for the worker's whole life
    os.dup2(log.fileno(), 1)
    os.dup2(log.fileno(), 2)
    # A fresh interpreter's streams, or the fork server's: Python's own TextIOWrapper either way.
    cast(TextIOWrapper, sys.stdout).reconfigure(line_buffering=True)
    cast(TextIOWrapper, sys.stderr).reconfigure(line_buffering=True)
    _name_process(f"runner-job-{Path(run_dir).name}")
    _interrupt_once()
    if parent is None:  # spawned: the launcher is its parent
        launcher = multiprocessing.parent_process()
        assert launcher is not None and launcher.pid is not None, "a spawned worker knows its parent"
        parent = launcher.pid
    _die_with_launcher(parent)
    from runner.measure.job import run_and_record

    run_and_record(
        OmegaConf.create(config),
        Path(run_dir),
        before_timing=lambda: _wait_may_time(connection),
        turns=PipeTurns(connection) if turns else None,
    )


def _name_process(name: str) -> None:
    """What `ps`, `top` and psutil's name() show for this process (Linux; 15 characters)."""
    with contextlib.suppress(AttributeError, OSError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_NAME, name.encode()[:15], 0, 0, 0)


def _interrupt_once() -> None:
    """The first SIGINT or SIGTERM interrupts the measurement (run_and_record records it KILLED, with
    the signal's name); later ones must not break the recording. If the recording itself hangs with
    no launcher left to kill the worker, it exits after GRACE_S: `runner sync` records it KILLED."""
    fired: list[int] = []

    def handler(signum, frame):
        if fired:
            return
        fired.append(signum)
        if signum == signal.SIGTERM:
            _exit_later(GRACE_S, 128 + signum)
        raise Stopped(SIGTERM) if signum == signal.SIGTERM else KeyboardInterrupt()

    signal.signal(signal.SIGINT, handler)
    signal.signal(signal.SIGTERM, handler)


def _exit_later(after_s: float, code: int) -> None:
    timer = threading.Timer(after_s, os._exit, args=(code,))
    timer.daemon = True
    timer.start()


def _die_with_launcher(launcher: int) -> None:
    """SIGTERM this worker when its parent (the launcher, or the fork server that dies with it) dies: the
    kernel's parent-death signal where there is one, and a watchdog thread (the parent id changes when the
    parent dies) everywhere."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    except (AttributeError, OSError):  # not Linux: the watchdog alone
        pass
    if os.getppid() != launcher:  # it died before prctl took effect
        os.kill(os.getpid(), signal.SIGTERM)

    def watch() -> None:
        while os.getppid() == launcher:
            time.sleep(WATCHDOG_S)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, name="launcher-watchdog", daemon=True).start()

"""The job's worker process: how it is started (runner.launch.isolation spawns it, or its backend's fork server
forks it) and what it runs. The fork server imports this module, not the launcher's (isolation), so that it
imports no more than a worker needs; the launcher starts a spare server with it before importing Hydra."""

from __future__ import annotations

import contextlib
import ctypes
import multiprocessing
import os
import signal
import sys
import threading
import time
from io import TextIOWrapper
from pathlib import Path
from typing import TYPE_CHECKING, cast

from runner.launch.messages import Dismissed, Finished, MayTime, Ready, Turn, TurnDone
from runner.measure.stop import SIGTERM, Stopped
from runner.record.environment import ADDR_NO_RANDOMIZE

if TYPE_CHECKING:
    from multiprocessing.connection import Connection

    from runner.measure.timing import Measurement
    from runner.spec import JobSpec

GRACE_S = 30.0  # after Ctrl-C, how long the worker may take to record its samples
STORE_WAIT_S = 120.0  # the longest a worker waits for its parent to open the MLflow store before timing
WATCHDOG_S = 1.0  # how often the worker checks that its launcher is alive
PR_SET_PDEATHSIG = 1  # linux/prctl.h
PR_SET_NAME = 15
PERSONALITY_QUERY = 0xFFFFFFFF  # personality(2): read the persona, change nothing


class PipeTurns:
    """In the worker: the `timing.Turns` a coordinator hands out over a pipe (runner.launch.rounds)."""

    def __init__(self, connection: Connection):
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


def wait_may_time(connection) -> None:
    """In the worker, before its first timed call: until the launcher says MayTime, at most STORE_WAIT_S."""
    if connection.poll(STORE_WAIT_S):
        message = connection.recv()
        assert isinstance(message, MayTime), message


def start_fixed(process) -> None:
    with fixed_layout():
        start(process)


def start(worker) -> None:
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
def fixed_layout():
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


def start_spare_server(overrides: list[str]) -> None:
    """Start a fork server before the config is composed (its backend not known yet), so that it starts meanwhile;
    isolation.start_server() hands it its backend, or ends it where the composed config gives the job no server. None
    is started for overrides that say so already (isolation=inline, timing.fixed_layout=false, as typed)."""
    if {"isolation=inline", "timing.fixed_layout=false"}.intersection(overrides):
        return
    from runner.launch.fork_server import ForkServer

    with contextlib.suppress(OSError):  # isolation.start_server starts one, or Worker.start spawns
        ForkServer.start_spare(worker_main, start_fixed)


def worker_main(
    spec: JobSpec, run_dir: str, log_path: str, turns: bool, connection=None, parent: int | None = None
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
        spec,
        Path(run_dir),
        before_timing=lambda: wait_may_time(connection),
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

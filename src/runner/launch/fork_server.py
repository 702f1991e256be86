"""One process per backend that imports the runner and the framework once, then forks a fresh worker per job.

A sweep's jobs each still run in a process of their own, but a job's process starts as a copy of one that
has imported TensorFlow (or torch, or JAX) already: milliseconds instead of the seconds an import takes, and
the framework's pages shared between the jobs waiting for their turns. The server never runs an op, so no
framework runtime (thread pools, device contexts) exists when it forks. Every worker of a server has the
server's memory layout: the server starts with address-space randomization off (timing.fixed_layout), so
that layout is the one a fresh worker would have had; with fixed_layout=false each job is spawned afresh
instead (runner.launch.isolation), since only a fresh interpreter draws a layout of its own.

The launcher keeps a `ForkedWorker` per worker, which answers what isolation and rounds ask of a
multiprocessing.Process (pid, sentinel, join, exitcode, is_alive, kill); the server reaps its workers and
reports how each ended.
"""

from __future__ import annotations

import contextlib
import ctypes
import multiprocessing
import os
import queue
import signal
import sys
import threading
import traceback
from collections.abc import Callable
from multiprocessing import reduction
from multiprocessing.connection import Connection, wait
from multiprocessing.process import BaseProcess
from typing import Protocol

from runner.launch.interpreter import module_path, spawning_from
from runner.launch.messages import Ended, Fork, Forked, Load
from runner.spec import PythonEnvironment

FORK_TIMEOUT_S = 60.0  # a server that does not answer a fork request in this long is taken for dead
# What each job imports on its way besides its backend (its inputs, limits and machine load, its progress line,
# its record): imported once in the server, so that every worker forked from it starts with them.
JOB_MODULES = (
    "runner.measure.job",
    "runner.measure.data",
    "runner.measure.energy",
    "runner.measure.idle_poll",
    "runner.measure.limits",
    "runner.measure.machine_load",
    "runner.models.weights",
    "runner.record.environment",
    "runner.tasks.builtin",
    "h5py",
    "numpy.ma",
    "psutil",
    "rich.console",
    "rich.status",
    "threadpoolctl",
)


class ForkServerGone(RuntimeError):
    """The server died (the OOM killer, a crash in an import): the job is started the spawned way."""


class WorkerProcess(Protocol):
    """A job's worker as the launcher sees it: a spawned multiprocessing.Process or a ForkedWorker."""

    @property
    def pid(self) -> int | None: ...
    @property
    def exitcode(self) -> int | None: ...
    @property
    def sentinel(self) -> int: ...
    def join(self, timeout: float | None = None) -> None: ...
    def is_alive(self) -> bool: ...
    def kill(self) -> None: ...
    def close(self) -> None: ...


class ForkedWorker:
    """A worker forked by a server, as the launcher sees it. Its sentinel becomes readable once the server
    has reported its end."""

    def __init__(self, pid: int):
        self.pid = pid
        self.exitcode: int | None = None
        self._ended = threading.Event()
        self._read_end: int | None
        self._read_end, self._write_end = os.pipe()

    @property
    def sentinel(self) -> int:
        """Readable once the worker has ended; ValueError once closed, as multiprocessing's Process."""
        if self._read_end is None:
            raise ValueError(f"worker {self.pid} is closed")
        return self._read_end

    def ended(self, exitcode: int | None) -> None:
        self.exitcode = exitcode
        os.write(self._write_end, b"x")  # before the event: whoever the event wakes may close the read end
        os.close(self._write_end)
        self._ended.set()

    def close(self) -> None:
        """Release the sentinel once the worker has ended (ValueError before, as multiprocessing's Process)."""
        if self.is_alive():
            raise ValueError(f"worker {self.pid} is still running")
        if self._read_end is not None:
            os.close(self._read_end)
            self._read_end = None

    def join(self, timeout: float | None = None) -> None:
        self._ended.wait(timeout)

    def is_alive(self) -> bool:
        return not self._ended.is_set()

    def kill(self) -> None:
        if self.is_alive():
            try:
                os.kill(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


class ForkServer:
    """The launcher's handle on the server of one backend module."""

    _running: dict[str, ForkServer] = {}
    _spare: ForkServer | None = None  # started before its backend was known: the next new backend's

    @classmethod
    def for_backend(
        cls,
        module: str,
        worker_main: Callable,
        start: Callable[[BaseProcess], None],
        environment: PythonEnvironment | None = None,
    ) -> ForkServer:
        """The running server for `module` in `environment` (None: the runner's own): the spare if there is one, else
        started (by `start`, which may set the memory layout); its workers run `worker_main(*args, connection=...,
        parent=...)`. A server of another environment runs that environment's interpreter."""
        key = module if environment is None else f"{module} {environment.python}"
        server = cls._running.get(key)
        if server is None or not server.alive:
            spare = cls._claim_spare(module) if environment is None else None
            server = cls._running[key] = spare or cls(module, worker_main, start, environment)
        return server

    @classmethod
    def start_spare(cls, worker_main: Callable, start: Callable[[BaseProcess], None]) -> None:
        """Start a server while this process composes the config (Python and the runner start meanwhile); the first
        for_backend() hands it its backend, which it imports before what every job imports."""
        if cls._spare is None:
            cls._spare = cls(None, worker_main, start)

    @classmethod
    def stop_spare(cls) -> None:
        """End the spare server that no backend claimed, so that its imports run beside nothing that is timed."""
        spare, cls._spare = cls._spare, None
        if spare is not None:
            spare.process.terminate()

    @classmethod
    def _claim_spare(cls, module: str) -> ForkServer | None:
        spare, cls._spare = cls._spare, None
        if spare is None or not spare.alive:
            return None
        try:
            spare.connection.send(Load(module))
        except OSError:  # it died: a new server is started
            return None
        spare.process.name = f"runner-fork-server-{module}"
        return spare

    def __init__(
        self,
        module: str | None,
        worker_main: Callable,
        start: Callable[[BaseProcess], None],
        environment: PythonEnvironment | None = None,
    ):
        context = multiprocessing.get_context("spawn")
        self.path = list(sys.path) if environment is None else module_path(environment)  # its workers' module path
        self.connection, server_end = context.Pipe()
        self.process = context.Process(
            target=_serve,
            args=(module, worker_main, server_end, os.getpid()),
            name=f"runner-fork-server-{module or 'spare'}",
            daemon=True,
        )
        with spawning_from(environment):
            start(self.process)
        server_end.close()
        self.alive = True
        self._lock = threading.Lock()
        self._forked: queue.Queue[ForkedWorker] = queue.Queue()
        self._workers: dict[int, ForkedWorker] = {}
        threading.Thread(target=self._listen, name=f"fork-server-{module or 'spare'}", daemon=True).start()

    def fork(self, target_args: tuple, connection: Connection) -> ForkedWorker:
        """A new worker running the server's worker main with `target_args` and `connection` (its end of the
        job's pipe), in this process's environment variables and directory, with the module path of the server's
        Python environment."""
        context = {"environ": dict(os.environ), "path": self.path, "cwd": os.getcwd()}
        with self._lock:
            try:
                self.connection.send(Fork(target_args, context))
                reduction.send_handle(self.connection, connection.fileno(), self.process.pid)
                return self._forked.get(timeout=FORK_TIMEOUT_S)
            except (OSError, queue.Empty) as error:
                self.alive = False
                raise ForkServerGone(f"the fork server of {self.process.name} is gone") from error

    def _listen(self) -> None:
        """Register each worker as the server forks it, and record how it ended."""
        while True:
            try:
                message = self.connection.recv()
            except (EOFError, OSError):
                break
            if isinstance(message, Forked):
                worker = self._workers[message.pid] = ForkedWorker(message.pid)
                self._forked.put(worker)
            elif isinstance(message, Ended) and message.pid in self._workers:
                with contextlib.suppress(OSError):  # nothing may stop this thread: joins wait on it
                    self._workers.pop(message.pid).ended(message.exitcode)
        self.alive = False
        for worker in self._workers.values():  # their parent-death signal stops them: see job.log
            worker.ended(None)


# -- in the server ---------------------------------------------------------------------------------------


def _serve(module: str | None, worker_main: Callable, connection: Connection, launcher: int) -> None:
    """Import what every worker runs, the backend (a spare: the one its first message names), then the rest of the
    job's modules; then fork a worker per request and report each worker's end, until the launcher is gone. The
    framework before the rest, as a user's script imports it: with the job's modules first, JAX's jitted step took
    1.07 of a hand-written script's, 1.04 this way round (BENCHMARKS.md, parity process to process)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the workers and the launcher, which stop
    _end_with(launcher)
    devnull = os.open(os.devnull, os.O_WRONLY)  # the frameworks' import chatter; each worker logs to job.log
    os.dup2(devnull, 1)
    if not ("importtime" in sys._xoptions or os.environ.get("PYTHONPROFILEIMPORTTIME")):  # asked for: a start-up study
        os.dup2(devnull, 2)
    with contextlib.suppress(Exception):  # each worker imports it again and records why it cannot
        import runner.measure.job  # noqa: F401 - what every worker runs (a spare: while the launcher composes)
    if module is None:
        try:
            load: Load = connection.recv()
        except (EOFError, OSError):  # no backend claimed it
            os._exit(0)
        module = load.module
    _import_backend(module)
    _import_job_modules()
    workers: dict[int, int] = {}  # pidfd (readable once the worker has ended) -> pid
    me = os.getpid()
    while True:
        try:
            ready = wait([connection, *workers])  # asleep until a request or a worker's end: no timer wakes it
            if connection in ready:
                request: Fork = connection.recv()
                handle = reduction.recv_handle(connection)
                pid = os.fork()
                if pid == 0:
                    connection.close()
                    _run_worker(worker_main, request.target_args, request.context, Connection(handle), me)
                os.close(handle)
                workers[os.pidfd_open(pid)] = pid
                connection.send(Forked(pid))
            for pidfd in [r for r in ready if isinstance(r, int)]:  # the pidfds; the connection is not one
                _, status = os.waitpid(workers[pidfd], 0)
                connection.send(Ended(workers.pop(pidfd), os.waitstatus_to_exitcode(status)))
                os.close(pidfd)
        except (EOFError, OSError):  # the launcher is gone: the workers' parent-death signal follows this exit
            os._exit(0)


def _import_backend(module: str) -> None:
    with contextlib.suppress(Exception):  # each worker imports it again and records why it cannot
        from runner.backends import load_backend

        load_backend(module)


def _import_job_modules() -> None:
    """JOB_MODULES, and the version a record names, each where it can be had (a worker records what it cannot)."""
    import importlib

    import runner

    for name in JOB_MODULES:
        with contextlib.suppress(Exception):
            importlib.import_module(name)
    runner.version()


def _run_worker(worker_main: Callable, target_args: tuple, context: dict, connection: Connection, server: int) -> None:
    """In the forked worker: the launcher's environment, then the worker main; never returns."""
    os.environ.clear()
    os.environ.update(context["environ"])
    sys.path[:] = context["path"]
    code = 0
    try:
        os.chdir(context["cwd"])
        worker_main(*target_args, connection=connection, parent=server)
    except BaseException:  # noqa: BLE001 - as a spawned worker would: the traceback into job.log, exit 1
        traceback.print_exc()
        code = 1
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)  # the server's atexit handlers and the frameworks' teardown are not this job's


def _end_with(launcher: int) -> None:
    """SIGTERM this server when the launcher dies (the kernel's parent-death signal, Linux)."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (AttributeError, OSError):
        pass
    if os.getppid() != launcher:
        os._exit(0)

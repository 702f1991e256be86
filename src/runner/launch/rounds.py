"""Interleaved rounds: the jobs of a sweep take turns measuring, so that every job meets the same phases
of a busy machine and their ratio holds.

With the basic launcher and isolation=process, each job of a sweep is set up in its worker processes
(timing.processes of them: framework import, inputs, first call, warm-up), one job after the other, and then
waits. A job's processes take its turns in rotation, so that its typical time averages their lasting offsets
(runner.report.ratio); the first records the job with every process's samples, the others end unrecorded. Once
Hydra has launched every job, `run` hands out the turns: round 1 in job order, round 2 in reverse order, and so
on, so that no job is always first, and each job follows itself as often as the others. A turn begins once the
previous worker has no thread running (a thread pool spins on briefly after its last op). In a turn a job re-warms
briefly and samples for at most its share of what calibration and warm-up left of max_time_s. Then each job's
first worker checks its results against the float64 reference and writes its record, and each job is logged to
MLflow. A job whose block of calls is too long for `rounds` turns in its budget (timing.affordable_rounds) takes
fewer, spread evenly over the rounds.

Keeping the live workers costs memory, not imports: when the next job would leave less than
MEMORY_RESERVE free, the jobs set up so far are measured first (their rounds then differ from the later
jobs', and runner.report.ratio compares the two groups unpaired).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import wait
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from runner import identity
from runner.launch import isolation, process_dirs
from runner.launch.messages import Finished, Ready, Turn, TurnDone
from runner.launch.sweep_lines import Every, time_left
from runner.measure.samples import PROCESS, SECONDS
from runner.measure.stop import Stopped, StopReason, stop_reason
from runner.measure.timing import Measurement
from runner.record.result import Result, Status
from runner.record.table import format_resolution
from runner.spec import JobSpec

if TYPE_CHECKING:
    from runner.report.timings import Timings

MIN_ROUNDS_TO_STOP = 8  # runner.report.ratio.MIN_BATCHES: an interval from fewer may look narrow by chance
QUIET_WAIT_S = 0.05  # after its turn, a worker's threads (a spinning thread pool) may run this long at most
MEMORY_RESERVE = 2 * 2**30  # bytes to keep free, beside 1.5x the largest waiting worker

log = logging.getLogger(__name__)


@dataclass
class _Waiting:
    """A job set up in its worker processes, waiting for its turns; what it reported so far is kept here. Its
    first process records the job; the others (timing.processes) only take turns."""

    spec: JobSpec
    run_dir: Path
    parent_run_id: str | None
    workers: list[isolation.Worker]
    turns_left: list[int]  # each process's
    measurement: Measurement
    failed: str | None = None  # why its first worker stopped answering
    taken: int = 0  # turns taken: the next goes to the next process in rotation that has one left
    rounds: int = 0  # the turns it takes part in, all its processes together

    @property
    def worker(self) -> isolation.Worker:
        return self.workers[0]

    def next_process(self) -> int | None:
        """Which process takes the job's next turn: in rotation, skipping those with none left (None: no turn)."""
        count = len(self.workers)
        return next((i for i in ((self.taken + k) % count for k in range(count)) if self.turns_left[i]), None)


def wanted(spec: JobSpec) -> bool:
    """True where a job of a sweep is measured in interleaved rounds: in a worker process, with timing.rounds
    above 1. The launcher that runs the sweep on this machine (RoundsLauncher) asks."""
    return spec.isolation == "process" and spec.timing.rounds > 1


class Coordinator:
    """One launch's interleaved rounds: the jobs set up and waiting for their turns, the rounds already
    handed out, and each measured job's record (`outcomes`, by run directory). The launcher that runs the
    sweep (runner.launch.local_launcher.RoundsLauncher) owns one per launch. A launch first removes the worker
    folders that killed launches left (runner.launch.process_dirs)."""

    def __init__(self) -> None:
        process_dirs.remove_orphans()
        self.waiting: list[_Waiting] = []
        self.outcomes: dict[Path, Result] = {}
        self.next_round = 1  # rounds are numbered across the whole launch: jobs measured apart share none

    def set_up(self, spec: JobSpec, run_dir: Path, parent_run_id: str | None) -> Result | None:
        """Start the job's worker and wait until it is set up and warm. Returns None when it waits for its
        turns (measured by `run`), or its record when it ended before (a refused config, a crash)."""
        run_dir = Path(run_dir)
        if self.waiting and not _memory_for_another(self.waiting):
            log.info(f"less than {MEMORY_RESERVE / 2**30:.0f} GiB free: measuring the jobs set up so far")
            self.run()
        isolation.prepare(spec, run_dir, parent_run_id)
        worker = isolation.Worker(spec, run_dir, turns=True)
        worker.start()
        try:
            ready = _receive(worker)
        except KeyboardInterrupt as interrupt:
            return isolation.complete(spec, run_dir, parent_run_id, worker.stop(stop_reason(interrupt)))
        if ready is None:  # it ended before it was ready
            worker.process.join()
            return isolation.complete(
                spec, run_dir, parent_run_id, worker.recorded(Status.FAILED, worker.exit_reason())
            )
        assert isinstance(ready, Ready), ready  # a worker's first message
        measurement = Measurement(first_call_s=ready.first_call_s, block_size=ready.block_size)
        job = _Waiting(spec, run_dir, parent_run_id, [worker], [ready.rounds], measurement, rounds=ready.rounds)
        try:
            for number in range(1, ready.processes):
                _another_process(job, number, ready.processes)
        except KeyboardInterrupt as interrupt:
            for other in job.workers[1:]:
                other.dismiss()
            return isolation.complete(spec, run_dir, parent_run_id, worker.stop(stop_reason(interrupt)))
        self.waiting.append(job)
        planned = spec.timing.rounds // len(job.workers) * len(job.workers)  # each process an equal share
        fewer = f" (a block of calls is too long for {planned} in timing.max_time_s)" if job.rounds < planned else ""
        log.debug(
            f"#{run_dir.name}: set up in {len(job.workers)} process{'es' * (len(job.workers) != 1)}; waits for its "
            f"{job.rounds} turns in the "
            f"interleaved rounds{fewer}"
        )
        return None

    def run(self, measured: Callable[[], None] = lambda: None, stopped_by: StopReason | None = None) -> None:
        """Hand out the turns of every waiting job, round after round; then let each worker record its job
        and log it, into `outcomes`. On Ctrl-C or SIGTERM meanwhile, the workers record what they measured
        and Stopped is raised; with `stopped_by` (the launch was stopped already), they record it at once.
        `measured` is called once nothing is timed any more."""
        jobs, self.waiting = self.waiting, []
        if not jobs:
            return
        interrupted = None
        if stopped_by is None:
            try:
                _rounds(jobs, self.next_round)
            except KeyboardInterrupt as interrupt:
                interrupted = stop_reason(interrupt)
        measured()
        self.next_round += max(job.rounds for job in jobs)
        for job in jobs:
            result = _finish(job, stopped_by or interrupted)
            self.outcomes[job.run_dir] = isolation.complete(job.spec, job.run_dir, job.parent_run_id, result)
        if interrupted:
            raise Stopped(interrupted)


def measure_alone(spec: JobSpec, run_dir: Path) -> Result:
    """A single run measured as a sweep's job is (its turns over timing.rounds rounds, handed to its timing.processes
    worker processes in rotation), so that it carries an interval over them, as a history's point and `runner
    compare` of two single runs need; returns its record."""
    coordinator = Coordinator()
    ended = coordinator.set_up(spec, Path(run_dir), None)
    if ended is not None:  # refused or crashed before its turns: its record
        return ended
    coordinator.run()
    return coordinator.outcomes[Path(run_dir)]


def _rounds(jobs: list[_Waiting], first_round: int) -> None:
    """Every round's turns, until every comparison resolves timing.resolve (from MIN_ROUNDS_TO_STOP rounds on) or
    the rounds are over; a progress line after the first round, every few seconds and after the last, with the
    time left at the pace of the rounds so far."""
    total, progress = max(job.rounds for job in jobs), Every(log)
    turns, taken = sum(job.rounds for job in jobs), 0  # the time left goes by turns: rounds differ in length
    resolve = jobs[0].spec.timing.resolve
    widest = math.nan
    for index in range(total):
        order = jobs if index % 2 == 0 else jobs[::-1]
        for job in order:
            if takes_part(index, job.rounds, total):
                taken += 1
                if job.failed is None:
                    _turn(job, first_round + index)
        elapsed = progress.elapsed()
        if resolve and index + 1 >= MIN_ROUNDS_TO_STOP and index + 1 < total:
            widest = widest_resolution(jobs)
            if widest <= resolve:
                log.info(
                    f"every comparison resolves {widest:.1%} (timing.resolve={resolve:g}) after {index + 1} of "
                    f"{total} rounds: done"
                )
                return
        progress.say(
            f"round {index + 1} of {total} done: {len(jobs)} jobs, {elapsed:.1f} s so far"
            f"{time_left(elapsed, taken, turns)}",
            always=index == 0 or index + 1 == total,
        )
    widest = widest_resolution(jobs)
    if resolve and widest > resolve:
        # an unstable job has no resolution (the sign test of its rounds may still order it)
        said = "nothing (rounds disagree)" if math.isinf(widest) else f"only {format_resolution(widest)}"
        line = (
            f"out of budget: a comparison resolves {said} after {total} rounds (timing.resolve={resolve:g});"
            " a longer timing.max_time_s narrows it (the table's resolution column has each)"
        )
        if not keep_warning(jobs[0].run_dir.parent, line):
            log.warning(line)


def keep_warning(sweep_dir: Path, line: str) -> bool:
    """A warning of the whole sweep, kept in its sweep.json (`warnings`): the sweep's end prints it with the jobs'
    warnings under the table (summary.print_table), wherever the rounds ran (a cluster node's log is no terminal),
    and the parent run's description and summary.md repeat them. False where the jobs are no sweep's (a single
    run): the caller says it then."""
    from runner.record.sweep_file import read_sweep_file, write_sweep_file

    info = read_sweep_file(sweep_dir)
    if info and line not in info.get("warnings", []):
        write_sweep_file(sweep_dir, {**info, "warnings": [*info.get("warnings", []), line]})
    return bool(info)


def _timings(job: _Waiting) -> Timings:
    """A job's samples as runner.report.comparison takes them, with the repeated parts of its calls where its task
    times them (runner.tasks.Task.repeated_parts)."""
    from runner.report.ratio import Job
    from runner.report.timings import Timings
    from runner.tasks import task_class

    samples = job.measurement.samples
    replicate = Job(np.asarray(samples.seconds), np.asarray(samples.rounds), np.asarray(samples.processes))
    parts = task_class(job.spec.task_settings.get("_target_")).parts_of(samples.columns)
    return Timings((replicate,), parts=() if parts is None else (parts,))


def widest_resolution(jobs: list[_Waiting]) -> float:
    """The widest resolution among the comparisons the sweep's table will make (each job against the fastest
    doing the same work, runner.report.comparison.versus_fastest); NaN where nothing is compared, inf where a
    comparison has no interval yet."""
    from runner.report.comparison import versus_fastest  # runner.report's package imports pandas

    groups: dict[str, list[_Waiting]] = {}
    for job in jobs:
        if job.failed is None and len(job.measurement.samples):
            groups.setdefault(work(job.spec), []).append(job)
    widest = math.nan
    for group in (g for g in groups.values() if len(g) > 1):
        candidates = [_timings(j) for j in group]
        for found in versus_fastest(candidates, [configuration(j.spec) for j in group]):
            if not found.is_baseline:
                value = math.inf if math.isnan(found.resolution) else found.resolution
                widest = value if math.isnan(widest) else max(widest, value)
    return widest


def work(spec: JobSpec) -> str:
    """What two jobs must share to be compared (runner.identity.work)."""
    return identity.work(spec.params()).key


def configuration(spec: JobSpec) -> str:
    """A job's configuration, its seed aside: jobs that share it are replicates (ratio.process_spread)."""
    return identity.configuration(spec.params()).key


def _another_process(job: _Waiting, number: int, processes: int) -> None:
    """Start one more of the job's `processes` worker processes, in a directory of its own that goes when it does;
    it takes as many turns as the first (its own calibration may afford another plan). One that ends before it is
    ready is left out: the job then has its other processes' turns only."""
    directory = process_dirs.make(job.run_dir.name, number)  # its process: runner-job-1.1
    worker = isolation.Worker(job.spec.in_processes(processes), directory, turns=True)
    worker.start()
    try:
        ready = _receive(worker)
    except KeyboardInterrupt:
        worker.dismiss()
        raise
    if not isinstance(ready, Ready):
        worker.process.join()
        log.warning(f"#{job.run_dir.name}: its process {number} ended before it was set up ({worker.exit_reason()})")
        worker.dismiss()
        return
    turns = min(ready.rounds, job.turns_left[0])
    job.workers.append(worker)
    job.turns_left.append(turns)
    job.rounds += turns


def takes_part(index: int, turns: int, total: int) -> bool:
    """Whether a job with `turns` turns takes part in round `index` (from 0) of `total`: its turns spread
    evenly over the rounds, the last round always among them."""
    return (index * turns) // total != ((index + 1) * turns) // total


def _turn(job: _Waiting, round_: int) -> None:
    """One turn of one job, taken by its next process in rotation; its samples are kept here too, in case its
    worker dies later. Where one of its other processes dies, its turns are lost and the job goes on."""
    number = job.next_process()
    if number is None:
        return
    worker = job.workers[number]
    job.taken, job.turns_left[number] = job.taken + 1, job.turns_left[number] - 1
    try:
        worker.connection.send(Turn(round_))
        message = _receive(worker)
    except OSError:  # its worker is gone
        message = None
    if not isinstance(message, TurnDone):
        worker.process.join()
        if number == 0:
            job.failed = f"{worker.exit_reason()} in round {round_}"
        else:
            log.warning(f"#{job.run_dir.name}: its process {number} stopped in round {round_} ({worker.exit_reason()})")
            job.turns_left[number] = 0
        return
    _wait_until_quiet(worker.pid)
    taken = dict(message.samples)
    taken[PROCESS] = [number] * len(taken[SECONDS])
    job.measurement.samples.extend(taken)


def _wait_until_quiet(pid: int) -> None:
    """Hand the machine over only once the worker whose turn ended has no thread running: a framework's
    thread pool spins a while after its last op, and the next job's turn would share the cores with it."""
    from runner.measure.machine_load import runnable_threads

    deadline = time.perf_counter() + QUIET_WAIT_S
    while runnable_threads(pid) and time.perf_counter() < deadline:
        time.sleep(0.0002)


def _receive(worker: isolation.Worker) -> object | None:
    """The worker's next message, or None when it ended first."""
    ready = wait([worker.connection, worker.process.sentinel])
    if worker.connection in ready:
        try:
            return worker.connection.recv()
        except (EOFError, ConnectionResetError):  # reset: it ended with a message of ours unread
            return None
    return None


def _finish(job: _Waiting, stopped_by: StopReason | None) -> Result:
    """Tell the worker the rounds are over (or stop it), wait for its record; a worker that died leaves
    a FAILED record with the samples it reported."""
    for other in job.workers[1:]:
        other.dismiss()
    if stopped_by:
        return job.worker.stop(stopped_by, job.measurement)
    if job.failed is None:
        everyone = job.measurement.samples.columns if len(job.workers) > 1 else None
        try:
            job.worker.connection.send(Finished(everyone))
        except OSError:
            pass
        job.worker.process.join()
        if job.worker.process.exitcode:
            job.failed = job.worker.exit_reason()
    return job.worker.recorded(Status.FAILED, job.failed or job.worker.exit_reason(), job.measurement)


def _memory_for_another(waiting: list[_Waiting]) -> bool:
    """Whether one more live worker fits: free memory above the reserve and 1.5x the largest waiting one
    (its own memory: a forked worker shares the framework's pages with its fork server and the others)."""
    import psutil

    largest = 0
    for worker in (w for job in waiting for w in job.workers):
        try:
            largest = max(largest, psutil.Process(worker.process.pid).memory_full_info().uss)
        except psutil.Error:
            continue
    return psutil.virtual_memory().available > MEMORY_RESERVE + 1.5 * largest

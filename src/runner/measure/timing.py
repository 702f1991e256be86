"""Honest timing: device sync at every boundary, first call apart, warm-up, adaptive blocked repeats.

Calls are timed in blocks (n calls between two clock reads, like timeit and
torch.utils.benchmark's blocked_autorange) so that for microsecond workloads the clock and loop
overhead stays far below 0.1% of what is measured. Every block gives one sample: seconds per call.
"""

from __future__ import annotations

import bisect
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field, fields
from typing import Protocol

import numpy as np

from runner.backends import first_call
from runner.config import TimingConfig
from runner.measure.blocks import Clock, Timer, warm_up, warmed_block
from runner.measure.progress import SAMPLING, ProgressLine
from runner.measure.samples import Samples, Series, ordered_rel_iqr, rel_iqr, typical_s

NOISY_REL_IQR = 0.1  # above this IQR/median the result is flagged as noisy
# A turn starts with a re-warm (at least one block) unless its block is longer than this: the first block after
# the pause of the other jobs' turns runs slow (BENCHMARKS.md, A/A sweeps: a skipped re-warm).
LONG_BLOCK_S = 0.05
REWARM_S = 0.005  # at most this long (at least one block): the turn's fastest sample discounts a slow first block
MIN_ROUNDS, TURN_BLOCKS = 8, 8  # rounds (ratio.MIN_BATCHES), and blocks a turn where the budget allows both
PROCESS_TURNS = 16  # turns' worth of time each of a job's processes must get (affordable_processes)


_TIMING = TimingConfig()  # the timing.* defaults: one owner, runner.config


@dataclass(frozen=True)
class LoopSettings:
    """What measure()'s loop obeys: the timing.* settings of the same names, with their defaults, except rounds and
    processes: without turns the loop is one stretch in one process (a sweep's job gets timing.rounds, .processes)."""

    warmup_s: float = _TIMING.warmup_s
    min_warmup_calls: int = _TIMING.min_warmup_calls
    min_repeats: int = _TIMING.min_repeats
    max_time_s: float = _TIMING.max_time_s
    target_rel_iqr: float = _TIMING.target_rel_iqr
    min_block_s: float = _TIMING.min_block_s
    rounds: int = 1
    processes: int = 1

    @classmethod
    def of(cls, timing: TimingConfig) -> LoopSettings:
        """The loop's share of a job's timing.*."""
        return cls(**{f.name: getattr(timing, f.name) for f in fields(cls)})


@dataclass
class Measurement:
    first_call_s: float
    samples: Samples = field(default_factory=Samples)  # one per block: seconds per call, round, series
    block_size: int = 1
    warmup_calls: int = 0
    stopped_by: str = ""  # "spread", "time cap" or "interrupted"
    warmup_cut_short: bool = False  # max_time_s ended calibration or warm-up before warmup_s/min_warmup_calls
    energy_j: float | None = None  # over the timed phase (the samples), where a meter was given
    # the first call's parts the framework reported (runner.backends.first_call), by their metric names; {}: none
    first_call_parts: dict[str, float] = field(default_factory=dict)

    @property
    def samples_s(self) -> list[float]:
        return self.samples.seconds

    def stats(self) -> dict[str, float]:
        """Median, IQR, tail percentiles, mean, stdev and min of the samples (seconds per call, one per
        block: the percentiles are of block means, not of single calls)."""
        if not self.samples_s:
            return {"first_call_s": self.first_call_s, **self.first_call_parts}
        samples = np.asarray(self.samples_s)
        q25, median, q75, p90, p95, p99 = np.percentile(samples, [25, 50, 75, 90, 95, 99])
        return {
            "time_median_s": float(median),
            "time_iqr_s": float(q75 - q25),
            "time_p50_s": float(median),
            "time_p90_s": float(p90),
            "time_p95_s": float(p95),
            "time_p99_s": float(p99),
            "time_mean_s": float(samples.mean()),
            "time_stdev_s": float(samples.std(ddof=1)) if samples.size > 1 else 0.0,
            "time_min_s": float(samples.min()),
            "time_typical_s": typical_s(samples, self.samples.rounds),
            "first_call_s": self.first_call_s,
            **self.first_call_parts,
        }

    def timed_calls(self) -> int:
        return len(self.samples_s) * self.block_size

    def timed_s(self) -> float:
        """Seconds spent in the timed calls (the blocks' sum): what energy_j was read over, less the gaps."""
        return sum(self.samples_s) * self.block_size

    def rel_iqr(self) -> float:
        return rel_iqr(self.samples_s) if self.samples_s else float("nan")

    def turn_rel_iqr(self) -> float:
        """IQR/median within a turn (the median over rounds with 4 samples or more): how noisy the samples
        were, without the drift between rounds, which the ratio's interval accounts for. One round: rel_iqr."""
        rounds, samples = np.asarray(self.samples.rounds), np.asarray(self.samples_s)
        if len(set(self.samples.rounds)) <= 1:
            return self.rel_iqr()
        spreads = [rel_iqr(samples[rounds == r]) for r in np.unique(rounds) if (rounds == r).sum() >= 4]
        return float(np.median(spreads)) if spreads else self.rel_iqr()


class EnergyMeter(Protocol):
    def start(self) -> None: ...

    def stop(self) -> float | None:
        """Joules since start(), or None where the counter could not be read."""


class Turns(Protocol):
    """The measuring turns of a job measured in interleaved rounds (runner.launch.rounds hands them out)."""

    def ready(self, measurement: Measurement, rounds: int, processes: int) -> None:
        """Set up and warm (first call and block size known): the job may be given the first of its `rounds` turns;
        the job's budget pays for `processes` processes."""

    def wait(self) -> int | None:
        """Block until this job's next turn; its round number, or None once the rounds are over."""

    def done(self, samples: dict[str, list]) -> None:
        """The turn is over; these samples were taken in it (Samples.since: column by column)."""

    def job_samples(self) -> dict[str, list] | None:
        """Once the rounds are over: the job's samples from all its processes (column by column), None where this
        process took them all."""


class MeasurementInterrupted(KeyboardInterrupt):
    """Ctrl-C during timing; carries the samples taken so far."""

    def __init__(self, measurement: Measurement):
        super().__init__("interrupted while timing")
        self.measurement = measurement
        self.examples_per_call: int | None = None  # the job fills these in (runner.measure.job)
        self.series_metrics: dict[str, float] = {}


class MeasurementFailed(Exception):
    """The step raised after its first call (a later turn, an out-of-memory); carries the samples taken
    before it. The error itself is the exception's __cause__."""

    def __init__(self, measurement: Measurement):
        super().__init__("failed while timing")
        self.measurement = measurement
        self.examples_per_call: int | None = None  # the job fills these in (runner.measure.job)
        self.series_metrics: dict[str, float] = {}


def measure(
    fn: Callable[[], object],
    sync: Callable[[], None],
    settings: LoopSettings,
    progress: ProgressLine | None = None,
    keep: Callable[[object], object] = lambda output: output,
    energy: EnergyMeter | None = None,
    turns: Turns | None = None,
    series: dict[str, Series] | None = None,
    clock: Clock = time.perf_counter,
    own_thread: bool = False,
    parts: Callable[[], AbstractContextManager[first_call.Parts]] | None = None,
) -> tuple[Measurement, object]:
    """Time `fn` as `settings` say; returns the measurement and keep(output of the first call).

    After the first call, everything (calibration, warm-up, repeats) ends within about settings.max_time_s:
    calibration and warm-up may take half of it, and are cut short (and say so) when they would take more.
    `keep` runs right after the first call, before any other: a step may reuse its output buffers
    (torch.compile's CUDA graphs replay into the same memory), so what is kept must be copied off first.
    `energy`, where given, is read over the sampling phase, with the device synchronised at both ends.

    With `turns`, sampling happens in settings.rounds turns (fewer where a block is too long for that many:
    affordable_rounds) handed out by a coordinator, each a short re-warm and then samples; the turns share
    what calibration and warm-up left of max_time_s, as the single sampling phase does without `turns`; a job
    measured in several settings.processes takes its share of the rounds and of that time in each.
    Each of `series` adds a value to every sample (runner.measure.samples); `clock` times and stops everything.
    With `own_thread` the calls after the first run on a thread of their own, as shallow as a script's: some frameworks
    record the caller's stack at every call, at a cost that grows with its depth (a job's worker calls 17 frames deep;
    that thread 7). Each stretch of blocks (calibration and warm-up, the sampling, a turn) is one thread's work.
    `parts` hears the first call's tracing and compiling as the framework reports them (runner.backends.first_call)."""
    s = settings
    measurement, first_output = _first_call(fn, sync, clock, keep, progress, parts)
    start = clock()
    warm_until, deadline = start + s.max_time_s / 2, start + s.max_time_s
    timer = Timer(fn, sync, clock, own_thread)
    try:
        _phase(progress, "warm-up")
        found, warm = timer.run(warmed_block, timer, s.min_block_s, s.warmup_s, s.min_warmup_calls, warm_until)
        (block, calibrated, block_s), (measurement.warmup_calls, warmed, blocks_s) = found, warm
        # the plan of turns reads a typical block: one preempted calibration block once cost a job its other processes
        block_s = float(np.median([block_s, *blocks_s]))
        measurement.block_size = block
        measurement.warmup_cut_short = not (calibrated and warmed)
        _phase(progress, SAMPLING)
        sampling = _Sampling(timer, measurement, s.min_repeats, s.target_rel_iqr, progress, energy, series or {})
        if turns is None:
            timer.run(sampling.run, 1, deadline)
        else:
            _take_turns(turns, sampling, deadline - clock(), (s.rounds, s.processes), block_s, s.warmup_s)
    except KeyboardInterrupt as interrupt:
        measurement.stopped_by = "interrupted"
        raise MeasurementInterrupted(measurement) from interrupt
    except Exception as error:
        measurement.stopped_by = "failed"
        raise MeasurementFailed(measurement) from error
    return measurement, first_output


def _first_call(
    fn: Callable[[], object],
    sync: Callable[[], None],
    clock: Clock,
    keep: Callable[[object], object],
    progress: ProgressLine | None,
    parts: Callable[[], AbstractContextManager[first_call.Parts]] | None = None,
) -> tuple[Measurement, object]:
    """(Measurement with the first call's seconds and parts, keep(its output)): on the caller's thread, tracing and
    all. The framework is listened to from before the clock starts until after it stops."""
    _phase(progress, "first call (tracing, compilation)")
    with parts() if parts is not None else nullcontext(first_call.Parts()) as heard:
        sync()
        start = clock()
        first_output = fn()
        sync()
        first_call_s = clock() - start
    measurement = Measurement(first_call_s=first_call_s, first_call_parts=first_call.figures(heard, first_call_s))
    return measurement, keep(first_output)


def rewarm(warmup_s: float, rounds: int, block_s: float) -> float:
    """A turn's re-warm: warmup_s shared by the rounds, at most REWARM_S (>= 1 block), 0 for blocks > LONG_BLOCK_S."""
    return min(warmup_s / rounds, REWARM_S) if block_s <= LONG_BLOCK_S else 0.0


def affordable_rounds(rounds: int, sampling_s: float, block_s: float, warmup_s: float = 0.0) -> int:
    """The rounds a job takes part in: `rounds`, or fewer where a turn would not hold its re-warm and TURN_BLOCKS
    blocks (at 0.5 s, 40 rounds gave a 2 ms block one sample a turn, which cannot say whether it kept its core),
    yet not fewer than MIN_ROUNDS where a turn holds one block (one block: blocks longer than LONG_BLOCK_S)."""
    block_s, short = max(block_s, 1e-9), block_s <= LONG_BLOCK_S

    def most(blocks: int) -> int:  # the most rounds whose turns hold `blocks` blocks and the re-warm
        for n in range(rounds, 1, -1):
            rewarm_s = max(block_s, rewarm(warmup_s, n, block_s)) if short else 0.0
            if sampling_s / n >= blocks * block_s + rewarm_s:
                return n
        return 1

    return max(most(TURN_BLOCKS if short else 1), min(MIN_ROUNDS, most(1)))


def affordable_processes(processes: int, sampling_s: float, block_s: float, warmup_s: float) -> int:
    """How many of a job's `processes` its sampling time pays for: each must get the time of PROCESS_TURNS turns of
    TURN_BLOCKS blocks (with 8 or 9 turns each, at timing.max_time_s=0.5, a few busy turns moved a process's
    median, and the intervals widened to +-10-60%: BENCHMARKS.md); at least one."""
    turn_s = TURN_BLOCKS * block_s + max(block_s, rewarm(warmup_s, MIN_ROUNDS, block_s))
    return max(1, min(processes, int(sampling_s // (PROCESS_TURNS * turn_s))))


def _take_turns(
    turns: Turns, sampling: _Sampling, sampling_s: float, wanted: tuple[int, int], block_s: float, warmup_s: float
) -> None:
    """This process's share of the job's `wanted` rounds and processes (as many as `sampling_s` affords, and of
    sampling_s), then each turn given: a re-warm (>= 1 block unless 0: the step sat idle), then samples for its
    share of the time."""
    processes = affordable_processes(min(wanted), sampling_s, block_s, warmup_s)
    rounds = affordable_rounds(wanted[0] // processes, sampling_s / processes, block_s, warmup_s)
    turn_s, rewarm_s = sampling_s / processes / rounds, rewarm(warmup_s, rounds, block_s)
    m, timer = sampling.measurement, sampling.timer
    turns.ready(m, rounds, processes)
    while (round_ := turns.wait()) is not None:
        taken = len(m.samples)
        timer.run(_turn, sampling, round_, rewarm_s, turn_s)
        turns.done(m.samples.since(taken))
    if (everyone := turns.job_samples()) is not None:
        m.samples = Samples(everyone)


def _turn(sampling: _Sampling, round_: int, rewarm_s: float, turn_s: float) -> None:
    """One turn: the re-warm, then samples until its time is up."""
    timer, start = sampling.timer, sampling.timer.clock()
    warm_up(timer, sampling.measurement.block_size, rewarm_s, 0, start + min(rewarm_s, turn_s))
    sampling.run(round_, start + turn_s, spread_stops=False)


@dataclass
class _Sampling:
    """Timed blocks until the spread of this round's samples is small enough or the deadline passes."""

    timer: Timer
    measurement: Measurement
    min_repeats: int
    target_rel_iqr: float
    progress: ProgressLine | None
    energy: EnergyMeter | None
    series: dict[str, Series]
    energy_unread: bool = False  # a turn whose energy could not be read: no total

    def run(self, round_: int, deadline: float, spread_stops: bool = True) -> None:
        """Samples until the deadline, or until their spread is small (`spread_stops`; not in a turn of the rounds)."""
        m, block = self.measurement, self.measurement.block_size
        taken, start = len(m.samples), self.timer.clock()
        ordered: list[float] = []  # this run's samples in ascending order, for the spread
        for series in self.series.values():
            series.start()
        self.timer.sync()
        if self.energy is not None:
            self.energy.start()
        while True:
            for series in self.series.values():
                series.before_block()
            seconds = self.timer.block(block) / block
            m.samples.add(seconds, round_, {name: s.after_block(block) for name, s in self.series.items()})
            elapsed = self.timer.clock() - start
            if self.progress is not None:
                self.progress(m.samples_s, elapsed)
            if spread_stops:
                bisect.insort(ordered, seconds)
                if len(ordered) >= self.min_repeats and ordered_rel_iqr(ordered) <= self.target_rel_iqr:
                    m.stopped_by = "spread"
                    break
            if self.timer.clock() >= deadline:
                m.stopped_by = "time cap"
                break
        if self.energy is not None:
            self.timer.sync()
            joules = self.energy.stop()
            self.energy_unread |= joules is None
            m.energy_j = None if self.energy_unread or joules is None else (m.energy_j or 0.0) + joules
        for name, series in self.series.items():
            m.samples.revise(name, taken, series.end(m.samples.columns[name][taken:]))


def _phase(progress: ProgressLine | None, name: str) -> None:
    if progress is not None:
        progress.phase(name)

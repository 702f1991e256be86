"""The timing harness: first call apart, blocks long enough, every sample kept, statistics right. The loop's
decisions are tested on a fake clock (tests/fake_clock.py); one test reads the real one."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import threading
import time
from dataclasses import fields, replace

import numpy as np
import pytest
from fake_clock import FakeClock

from runner.config import TimingConfig
from runner.measure.samples import Samples, Series, ordered_rel_iqr, rel_iqr
from runner.measure.timing import (
    LoopSettings,
    Measurement,
    MeasurementFailed,
    MeasurementInterrupted,
    affordable_rounds,
    measure,
)

FORWARD_PASS_FAULTS = """
import resource, sys
import numpy as np
from runner.measure.malloc import keep_freed_memory
if sys.argv[1] == "keep":
    assert keep_freed_memory()
def call():  # like a forward pass: ten 8 MiB activations alive at once, all freed at the end
    activations = [np.ones(2**20) for _ in range(10)]
    del activations
call(); call()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(10):
    call()
print((resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / 10)
"""


QUICK = LoopSettings(warmup_s=0.0, min_warmup_calls=1, min_block_s=0.0)  # one call a block, one block of warm-up


def test_statistics_from_samples():
    m = Measurement(first_call_s=1.0, samples=Samples({"samples_s": [1.0, 2.0, 3.0, 4.0, 100.0]}))
    stats = m.stats()
    assert stats["time_median_s"] == 3.0
    assert stats["time_iqr_s"] == pytest.approx(np.percentile(m.samples_s, 75) - np.percentile(m.samples_s, 25))
    assert stats["time_min_s"] == 1.0 and stats["time_mean_s"] == pytest.approx(22.0)
    assert stats["first_call_s"] == 1.0


def test_first_call_timed_apart_and_blocks_reach_min_block():
    clock = FakeClock()
    m, first = measure(
        clock.step(0.00015, first=0.05),  # a slow first call, like tracing or compilation
        lambda: None,
        LoopSettings(
            warmup_s=0.0,
            min_warmup_calls=1,
            min_repeats=5,
            max_time_s=0.2,
            target_rel_iqr=float("inf"),
            min_block_s=0.001,
        ),
        clock=clock,
    )
    assert first == 1 and m.first_call_s == pytest.approx(0.05)
    assert m.block_size == 10  # blocks of 1, 2 and 5 calls last under 1 ms, 10 calls 1.5 ms
    assert m.warmup_calls == 10 and not m.warmup_cut_short  # one block: min_warmup_calls=1, warmup_s=0
    assert m.samples_s == pytest.approx([0.00015] * 5)  # the slow first call is in no sample
    assert m.stopped_by == "spread"


def test_the_device_is_synced_at_both_clock_reads_of_every_block():
    clock, events = FakeClock(), []
    step = clock.step(0.001)

    def read() -> float:
        events.append("r")
        return clock()

    measure(
        lambda: (events.append("c"), step()),
        lambda: events.append("s"),
        replace(QUICK, min_block_s=0.0025, min_repeats=3, max_time_s=1.0, target_rel_iqr=float("inf")),
        clock=read,
    )
    timeline = "".join(events)  # s: sync, r: clock read, c: call
    # first call; calibration's blocks of 1, 2 and 5 calls (5 ms >= 2.5 ms); one warm-up block; 3 samples
    assert [len(b) for b in re.findall(r"sr(c+)(?=sr)", timeline)] == [1, 1, 2, 5, 5, 5, 5, 5]
    assert timeline.count("c") == 29  # every call is in one of those blocks


def test_time_cap_stops_a_measurement_whose_spread_never_settles():
    """Calls alternate 0.5 and 3 ms and a block is one call: the samples alternate, their spread stays large."""
    clock = FakeClock()
    m, _ = measure(
        clock.step(0.0005, 0.003),
        lambda: None,
        replace(QUICK, min_repeats=3, max_time_s=0.1, target_rel_iqr=0.001),
        clock=clock,
    )
    assert m.block_size == 1 and m.stopped_by == "time cap"
    # calibration (3 ms) and warm-up (0.5 ms) leave 96.5 ms: 27 pairs of samples (94.5 ms) and one more of 3 ms
    assert m.samples_s == pytest.approx([0.003, 0.0005] * 27 + [0.003])


def test_blocks_of_an_even_count_average_an_alternation_and_the_spread_stops():
    """The same calls in blocks of two: every sample is 1.75 ms, so the spread settles at min_repeats. (With real
    sleeps, whether the alternation showed in the samples depended on the machine: the time-cap test saw 'spread'.)"""
    clock = FakeClock()
    m, _ = measure(
        clock.step(0.0005, 0.003),
        lambda: None,
        # min_block_s: one call (3 ms) is short of it, two (3.5 ms) are not
        replace(QUICK, min_block_s=0.0032, min_repeats=10, max_time_s=0.1, target_rel_iqr=0.03),
        clock=clock,
    )
    assert m.block_size == 2 and m.stopped_by == "spread"
    assert m.samples_s == pytest.approx([0.00175] * 10)


@pytest.mark.parametrize(
    ("warmup_s", "min_warmup_calls", "calls"),
    [(0.018, 3, 20), (0.0, 12, 15)],  # 4 blocks of 5 ms reach 18 ms; 3 blocks of 5 calls reach 12 calls
)
def test_warm_up_lasts_warmup_s_and_at_least_min_warmup_calls_in_whole_blocks(warmup_s, min_warmup_calls, calls):
    clock = FakeClock()
    m, _ = measure(
        clock.step(0.001),
        lambda: None,
        LoopSettings(
            warmup_s=warmup_s,
            min_warmup_calls=min_warmup_calls,
            min_block_s=0.0025,  # blocks of 5 calls
            min_repeats=3,
            max_time_s=1.0,
            target_rel_iqr=float("inf"),
        ),
        clock=clock,
    )
    assert m.block_size == 5 and m.warmup_calls == calls and not m.warmup_cut_short


def test_max_time_cuts_warm_up_short_and_sampling_ends_at_the_cap():
    clock = FakeClock()
    m, _ = measure(
        clock.step(0.001),
        lambda: None,
        LoopSettings(
            warmup_s=1.0,
            min_warmup_calls=1,
            min_block_s=0.0025,  # blocks of 5 calls: calibration takes 1 + 2 + 5 ms
            min_repeats=10**6,  # the spread never stops it
            max_time_s=0.1,
        ),
        clock=clock,
    )
    # warm-up may run to half of max_time_s (50 ms): 9 blocks from 8 ms to 53 ms; then samples to 100 ms and past
    assert m.warmup_cut_short and m.warmup_calls == 45
    assert len(m.samples_s) == 10 and m.stopped_by == "time cap"
    assert clock.now - m.first_call_s == pytest.approx(0.103)  # the cap, overrun by less than a block


def test_max_time_cuts_block_calibration_short():
    clock = FakeClock()
    m, _ = measure(
        clock.step(0.001), lambda: None, LoopSettings(min_block_s=60.0, max_time_s=0.1, min_repeats=10**6), clock=clock
    )
    # blocks of 1, 2, 5, 10 and 20 calls end at 38 ms, one of 50 calls past half of max_time_s: that one is kept;
    # warm-up makes one block of it all the same (MIN_WARMUP_BLOCKS), and the one sample follows it
    assert m.warmup_cut_short and m.block_size == 50 and m.warmup_calls == 50
    assert m.samples_s == pytest.approx([0.001]) and m.stopped_by == "time cap"


def test_a_call_that_spends_the_warm_ups_budget_is_still_warmed_before_the_first_sample():
    """Issue 77: under load one generation took 1.6 s; its calibration block alone spent the half of max_time_s that
    calibration and warm-up may take, warm-up stopped after 0 calls, and the one sample timed was a cold call (the
    third here: 3 s, the calls after it 1.6 s). Warm-up now makes one block whatever the budget; the sample is warm."""
    clock = FakeClock()
    durations = [5.0, 1.6, 3.0] + [1.6] * 10  # first call (compiling), calibration's one call, then a cold call
    calls = iter(durations)
    m, _ = measure(
        lambda: clock.advance(next(calls)),
        lambda: None,
        LoopSettings(warmup_s=0.2, min_warmup_calls=3, min_block_s=0.002, max_time_s=2.0),
        clock=clock,
    )
    assert m.first_call_s == 5.0 and m.block_size == 1
    assert m.warmup_calls == 1 and m.warmup_cut_short  # one block, however late: min_warmup_calls=3 not met, said so
    assert m.samples_s == pytest.approx([1.6]) and m.stopped_by == "time cap"  # not the cold 3 s call


def test_no_warm_up_asked_makes_none_whatever_the_budget():
    clock = FakeClock()
    m, _ = measure(
        clock.step(1.6),
        lambda: None,
        LoopSettings(warmup_s=0.0, min_warmup_calls=0, min_block_s=0.002, max_time_s=2.0),
        clock=clock,
    )
    assert m.warmup_calls == 0 and m.samples_s == pytest.approx([1.6])


def test_interrupt_keeps_samples():
    clock = FakeClock()
    step = clock.step(0.001)

    def fn():
        if step() > 20:
            raise KeyboardInterrupt

    with pytest.raises(MeasurementInterrupted) as caught:
        measure(fn, lambda: None, replace(QUICK, min_repeats=100, max_time_s=10, target_rel_iqr=0.0), clock=clock)
    # what was measured before Ctrl-C survives: calls 4 to 20 (after the first, calibration's and warm-up's)
    assert len(caught.value.measurement.samples_s) == 17
    assert caught.value.measurement.stopped_by == "interrupted"


def _depth() -> int:
    frame, depth = sys._getframe(1), 0
    while frame is not None:
        frame, depth = frame.f_back, depth + 1
    return depth


def _called_at_depth(depth: int, fn):
    return fn() if depth == 0 else _called_at_depth(depth - 1, fn)


@pytest.mark.parametrize("own_thread", [True, False])
def test_own_thread_times_the_calls_from_a_stack_as_shallow_as_a_scripts(own_thread):
    """jaxlib records the caller's Python stack at every call, at a cost that grows with its depth: from the runner's
    worker (17 frames deep) an MLP's jitted gradients took 1.12 of a script's time, from a thread of their own 1.05
    (BENCHMARKS.md, parity process to process). With own_thread the blocks after the first call run on that thread."""
    clock, calls = FakeClock(), []
    step = clock.step(0.001)

    def fn():
        calls.append((threading.current_thread(), _depth()))
        step()

    _called_at_depth(100, lambda: measure(fn, lambda: None, QUICK, clock=clock, own_thread=own_thread))
    (first_thread, first_depth), later = calls[0], calls[1:]
    assert first_thread is threading.main_thread() and first_depth > 100  # the first call is the caller's
    assert len(later) > 10
    if own_thread:
        assert all(thread is not threading.main_thread() and depth < 15 for thread, depth in later)
    else:
        assert all(thread is threading.main_thread() and depth > 100 for thread, depth in later)


def test_a_call_failing_or_interrupted_on_its_own_thread_ends_the_measurement_with_its_samples():
    clock = FakeClock()
    step = clock.step(0.001)

    def failing():
        if step() > 20:
            raise RuntimeError("out of memory")

    settings = replace(QUICK, min_repeats=100, max_time_s=10, target_rel_iqr=0.0)
    with pytest.raises(MeasurementFailed) as failed:
        measure(failing, lambda: None, settings, clock=clock, own_thread=True)
    assert len(failed.value.measurement.samples_s) == 17 and failed.value.measurement.stopped_by == "failed"
    assert isinstance(failed.value.__cause__, RuntimeError)

    step = clock.step(0.001)

    def interrupted():
        if step() > 20:
            raise KeyboardInterrupt

    with pytest.raises(MeasurementInterrupted) as caught:
        measure(interrupted, lambda: None, settings, clock=clock, own_thread=True)
    assert len(caught.value.measurement.samples_s) == 17


def test_ctrl_c_while_the_caller_waits_stops_the_timing_thread():
    """Ctrl-C reaches the job's thread, which waits while its own thread times the calls: that thread stops at its
    next block, nothing is added to the measurement after it is raised, and no thread is left timing."""
    clock, calls, handled = FakeClock(), [], threading.Event()
    step = clock.step(0.001)

    def on_sigint(signum, frame):
        handled.set()
        raise KeyboardInterrupt

    def fn():
        calls.append(step())
        if len(calls) == 20:
            signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)
            assert handled.wait(30)

    settings = replace(QUICK, min_repeats=100, max_time_s=100, target_rel_iqr=0.0)  # 100,000 calls unless stopped
    previous = signal.signal(signal.SIGINT, on_sigint)
    try:
        with pytest.raises(MeasurementInterrupted) as caught:
            measure(fn, lambda: None, settings, clock=clock, own_thread=True)
    finally:
        signal.signal(signal.SIGINT, previous)
    m, taken, samples = caught.value.measurement, len(calls), len(caught.value.measurement.samples_s)
    # stopped long before the 100,000: a bound that a busy machine's delay in handling the signal cannot pass
    assert m.stopped_by == "interrupted" and 20 <= taken < 100_000 and samples > 10
    time.sleep(0.05)
    assert len(calls) == taken and len(m.samples_s) == samples
    assert not [t for t in threading.enumerate() if t.name == "runner-timed-calls"]


def test_the_spread_between_blocks_is_numpys_rel_iqr_of_the_samples_so_far():
    """The loop keeps its samples in order and reads the quartiles itself (numpy's percentile between blocks cost a
    TensorFlow eager step 2.5%); its stop decisions are those numpy's quartiles gave."""
    rng = np.random.default_rng(0)
    for n in (1, 2, 3, 4, 5, 10, 11, 100, 1001):
        samples = list(rng.lognormal(-9, 0.3, n))
        q25, median, q75 = np.percentile(samples, [25, 50, 75])
        assert ordered_rel_iqr(sorted(samples)) == pytest.approx((q75 - q25) / median, rel=1e-12)
        assert rel_iqr(samples) == ordered_rel_iqr(sorted(samples))
    assert ordered_rel_iqr([0.0, 0.0, 1.0]) == rel_iqr([1.0, 0.0, 0.0]) == float("inf")


def test_the_real_clock_times_real_calls():
    """The default clock, on what time.sleep guarantees: a sleep lasts at least its argument (both read the
    monotonic clock), so no sample is shorter and the time cap is never reached early."""
    calls = [0]

    def fn():
        calls[0] += 1
        time.sleep(0.02 if calls[0] == 1 else 0.001)

    start = time.perf_counter()
    m, _ = measure(fn, lambda: None, replace(QUICK, min_repeats=10**6, max_time_s=0.05))
    assert time.perf_counter() - start >= 0.05 + m.first_call_s and m.stopped_by == "time cap"
    assert m.first_call_s >= 0.02 and m.samples_s and min(m.samples_s) >= 0.001 - 1e-9  # 1e-9: float rounding


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's allocator")
def test_kept_freed_memory_means_no_page_faults_per_call():
    """glibc hands a forward pass's freed activations back to the OS, so every call page-faults them in
    again; with keep_freed_memory (the runner's default) a steady call costs no page faults."""

    def faults_per_call(setting: str) -> float:
        out = subprocess.run([sys.executable, "-c", FORWARD_PASS_FAULTS, setting], capture_output=True, text=True)
        assert out.returncode == 0, out.stderr
        return float(out.stdout)

    default, kept = faults_per_call("default"), faults_per_call("keep")
    assert default > 1000  # 80 MiB is 20480 pages: glibc trims most of them after every call
    assert kept < 0.01 * default


def test_tail_percentiles_and_stdev():
    samples = [float(i) for i in range(1, 101)]
    stats = Measurement(first_call_s=0.0, samples=Samples({"samples_s": samples})).stats()
    for name, q in (("p50", 50), ("p90", 90), ("p95", 95), ("p99", 99)):
        assert stats[f"time_{name}_s"] == pytest.approx(np.percentile(samples, q))
    assert stats["time_p99_s"] > stats["time_p95_s"] > stats["time_p90_s"] > stats["time_median_s"]
    assert stats["time_stdev_s"] == pytest.approx(np.std(samples, ddof=1))
    assert Measurement(first_call_s=0.0, samples=Samples({"samples_s": [2.0]})).stats()["time_stdev_s"] == 0.0


def test_first_output_kept_before_the_next_call_and_energy_spans_the_samples():
    """A step that overwrites its output buffer on every call (CUDA graphs do) still yields the first
    call's result; the energy meter starts after warm-up and stops after the last sample."""
    clock, buffer, events = FakeClock(), [0], []
    step = clock.step(0.001)

    def fn():
        step()
        buffer[0] += 1
        events.append("call")
        return buffer

    class Meter:
        def start(self):
            events.append("start")

        def stop(self):
            events.append("stop")
            return 3.0

    m, kept = measure(
        fn,
        lambda: None,
        replace(QUICK, min_repeats=3, max_time_s=0.05, target_rel_iqr=1.0),
        keep=lambda out: list(out),
        energy=Meter(),
        clock=clock,
    )
    assert kept == [1] and buffer[0] == 6  # first call, calibration, warm-up, 3 samples
    assert m.energy_j == 3.0
    timed = events[events.index("start") + 1 : events.index("stop")]
    assert len(timed) == m.timed_calls() == len(m.samples_s) * m.block_size == 3


class ScriptedTurns:
    """A coordinator handing out the given rounds, recording what the measurement reports."""

    def __init__(self, rounds: list[int]):
        self.rounds, self.ready_at, self.turns = list(rounds), None, []

    def ready(self, measurement: Measurement, rounds: int, processes: int) -> None:
        self.ready_at, self.affordable, self.processes = len(measurement.samples_s), rounds, processes

    def wait(self) -> int | None:
        return self.rounds.pop(0) if self.rounds else None

    def job_samples(self) -> dict[str, list] | None:
        return None  # the job's only process

    def done(self, samples: dict[str, list]) -> None:
        self.turns.append((samples["samples_s"], samples.get("sample_end_s")))


class FakeClockEnd(Series):
    """When each sample ended, on the fake clock."""

    def __init__(self, clock: FakeClock):
        self.clock = clock

    def after_block(self, calls: int) -> float:
        return self.clock()


# a turn samples to its end whatever the spread: the coordinator stops the rounds once the comparisons resolve
FAST_TURNS = replace(QUICK, min_repeats=3, target_rel_iqr=float("inf"))


def test_turns_sample_only_when_given_a_turn_and_label_each_sample_with_its_round():
    clock, turns = FakeClock(), ScriptedTurns([1, 2, 7])
    ends = {"sample_end_s": FakeClockEnd(clock)}
    m, _ = measure(
        clock.step(0.0002),
        lambda: None,
        replace(FAST_TURNS, max_time_s=0.3, rounds=3),
        turns=turns,
        series=ends,
        clock=clock,
    )
    assert turns.ready_at == 0 and turns.affordable == 3  # set up and warm, no sample yet
    # calibration and warm-up (a call each) leave 299.6 ms: a third of it is 500 samples of 0.2 ms
    counts = [len(samples) for samples, _ in turns.turns]
    assert counts == [500, 500, 500]
    assert m.samples.rounds == [1] * 500 + [2] * 500 + [7] * 500
    assert m.samples_s == [s for samples, _ in turns.turns for s in samples]  # the turns' samples, pooled
    ends = m.samples.columns["sample_end_s"]
    assert ends == sorted(ends) and len(ends) == 1500


def test_a_turn_lasts_at_most_the_sampling_budget_over_the_rounds():
    clock, turns = FakeClock(), ScriptedTurns([1, 2])
    ends = {"sample_end_s": FakeClockEnd(clock)}
    measure(
        clock.step(0.001),
        lambda: None,
        replace(FAST_TURNS, max_time_s=0.4, rounds=4),
        turns=turns,
        series=ends,
        clock=clock,
    )
    # the 0.4 s, less 2 ms of calibration and warm-up, shared by 4 turns: 99.5 ms, reached by the 100th sample
    # (uncapped, the first turn would use it all)
    assert [len(samples) for samples, _ in turns.turns] == [100, 100]
    assert [ends[-1] - ends[0] for _, ends in turns.turns] == pytest.approx([0.099, 0.099])


def test_a_step_failing_in_a_later_turn_keeps_the_samples_of_the_earlier_ones():
    clock, failing = FakeClock(), [False]
    step = clock.step(0.001)

    def fn():
        step()
        if failing[0]:
            raise RuntimeError("CUDA out of memory")

    class FailInRound3(ScriptedTurns):
        def wait(self):
            round_ = super().wait()
            failing[0] = round_ == 3
            return round_

    with pytest.raises(MeasurementFailed) as caught:
        measure(
            fn,
            lambda: None,
            replace(FAST_TURNS, max_time_s=0.3, rounds=4),
            turns=FailInRound3([1, 2, 3, 4]),
            clock=clock,
        )
    assert set(caught.value.measurement.samples.rounds) == {1, 2}
    assert caught.value.measurement.stopped_by == "failed"
    assert "CUDA out of memory" in str(caught.value.__cause__)


def test_a_job_whose_block_outlasts_a_turn_takes_fewer_rounds():
    assert affordable_rounds(40, sampling_s=4.0, block_s=0.002) == 40
    assert affordable_rounds(40, sampling_s=4.0, block_s=0.25) == 16  # a ResNet call: 16 turns of 0.25 s
    assert affordable_rounds(40, sampling_s=0.1, block_s=1.0) == 1
    # at 0.5 s a 2 ms block had one sample a turn in 40 rounds: now 14 turns of 8 blocks and a 5 ms re-warm
    assert affordable_rounds(40, sampling_s=0.3, block_s=0.002, warmup_s=0.2) == 14
    assert affordable_rounds(40, sampling_s=0.3, block_s=0.02, warmup_s=0.2) == 7  # not fewer than 8 blocks a turn
    clock, turns = FakeClock(), ScriptedTurns([1, 2])
    slow = clock.step(0.06)
    measure(
        slow,
        lambda: None,
        replace(FAST_TURNS, max_time_s=0.2, rounds=40, warmup_s=0.01),
        turns=turns,
        clock=clock,
    )
    # calibration and warm-up (60 ms each) leave 80 ms of the 0.2 s: one round, a turn of two 60 ms blocks
    assert turns.affordable == 1 and [len(samples) for samples, _ in turns.turns] == [2, 2]
    calls_outside_samples = slow() - 1 - sum(len(samples) for samples, _ in turns.turns)
    assert calls_outside_samples == 3  # first call, calibration, warm-up; a 60 ms block needs no re-warm of 10 ms


def test_one_preempted_calibration_block_does_not_cost_the_job_its_other_processes():
    """The plan of turns reads the typical block of calibration and warm-up: planned from the first block alone
    (50 ms here, the core taken away once), a 0.5 ms step afforded one process of two (test_rounds.py saw it)."""
    clock, calls = FakeClock(), [0]

    def step():
        calls[0] += 1
        clock.advance(0.05 if calls[0] == 2 else 0.0005)  # call 2: the first block of the calibration

    turns = ScriptedTurns([1, 2])
    settings = replace(FAST_TURNS, max_time_s=0.4, rounds=4, processes=2, warmup_s=0.01)
    measure(step, lambda: None, settings, turns=turns, clock=clock)
    assert turns.processes == 2 and turns.affordable == 2  # 4 rounds, 2 a process


def test_every_turn_starts_with_a_re_warm_of_a_block_unless_the_block_is_long():
    """A 10 ms block is longer than warmup_s / rounds (5 ms) but not a warm-up of its own: after the other
    jobs' turns the first block of a turn ran 23-61% slow (TensorFlow eager), so each turn re-warms one block
    before it samples."""
    clock = FakeClock()
    step = clock.step(0.01)
    calls = [0]

    def counted():
        calls[0] = step()

    class Counting(ScriptedTurns):
        extra: list[int]

        def wait(self):
            self.at_start = calls[0]
            return super().wait()

        def done(self, samples):
            super().done(samples)
            self.extra.append(calls[0] - self.at_start - len(samples["samples_s"]))

    turns = Counting([1, 2, 3])
    turns.extra = []
    measure(
        counted,
        lambda: None,
        replace(FAST_TURNS, max_time_s=0.6, rounds=3, warmup_s=0.015),
        turns=turns,
        clock=clock,
    )
    assert turns.extra == [1, 1, 1]


def test_the_loop_obeys_the_timing_settings_of_the_same_names():
    """measure() takes the loop's share of timing.* (runner.config.TimingConfig), typed: a timing.* key it does not
    use (timing.poll_idle, timing.series, ...) never reaches it."""
    loop = LoopSettings.of(TimingConfig(max_time_s=1.5, rounds=7, poll_idle=True))
    assert (loop.max_time_s, loop.rounds, loop.processes, loop.warmup_s) == (1.5, 7, 3, 0.2)
    assert {f.name for f in fields(LoopSettings)} < {f.name for f in fields(TimingConfig)}


def test_noise_within_turns_leaves_out_the_drift_between_rounds():
    """Round 2 ran twice as slow (a busy phase): the pooled IQR shows it, the spread within turns does not."""
    steady = [1.0, 1.01, 0.99, 1.0, 1.02]
    m = Measurement(0.0, Samples({"samples_s": steady + [2 * s for s in steady], "sample_round": [1] * 5 + [2] * 5}))
    assert m.rel_iqr() > 0.5 and m.turn_rel_iqr() < 0.03
    one_round = Measurement(0.0, Samples({"samples_s": steady}))
    assert one_round.turn_rel_iqr() == one_round.rel_iqr()

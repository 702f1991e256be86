"""The timing harness: first call apart, blocks long enough, every sample kept, statistics right."""

from __future__ import annotations

import subprocess
import sys
import time

import numpy as np
import pytest

from runner.measure.samples import SampleEnd, Samples
from runner.measure.timing import Measurement, MeasurementFailed, MeasurementInterrupted, affordable_rounds, measure

FORWARD_PASS_FAULTS = """
import resource, sys
import numpy as np
from runner.measure.timing import keep_freed_memory
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


def test_statistics_from_samples():
    m = Measurement(first_call_s=1.0, samples=Samples({"samples_s": [1.0, 2.0, 3.0, 4.0, 100.0]}))
    stats = m.stats()
    assert stats["time_median_s"] == 3.0
    assert stats["time_iqr_s"] == pytest.approx(np.percentile(m.samples_s, 75) - np.percentile(m.samples_s, 25))
    assert stats["time_min_s"] == 1.0 and stats["time_mean_s"] == pytest.approx(22.0)
    assert stats["first_call_s"] == 1.0


def test_first_call_timed_apart_and_blocks_reach_min_block():
    calls = []

    def fn():
        calls.append(1)
        if len(calls) == 1:
            time.sleep(0.05)  # a slow first call, like tracing or compilation
        return len(calls)

    m, first = measure(
        fn,
        lambda: None,
        warmup_s=0.0,
        min_warmup_calls=1,
        min_repeats=5,
        max_time_s=0.2,
        target_rel_iqr=float("inf"),  # stops at min_repeats, however loaded the machine
        min_block_s=0.001,
    )
    assert first == 1
    assert m.first_call_s >= 0.05
    assert m.block_size >= 10  # a call costs ~100 ns: one block holds many calls
    assert m.block_size * max(m.samples_s) * 0.5 < 0.05  # the slow first call is not in any sample
    assert len(m.samples_s) >= 5 and m.stopped_by == "spread"


def test_sync_called_at_every_clock_read():
    syncs = []
    m, _ = measure(
        lambda: None,
        lambda: syncs.append(1),
        warmup_s=0.0,
        min_warmup_calls=1,
        min_repeats=3,
        max_time_s=0.05,
        target_rel_iqr=1.0,
        min_block_s=0.0,
    )
    blocks = 1 + 1 + len(m.samples_s)  # first call, calibration, samples (warm-up adds more)
    assert len(syncs) >= 2 * blocks


def test_time_cap_stops_noisy_measurement():
    count = [0]

    def noisy():  # alternates between two durations: the spread never settles
        count[0] += 1
        time.sleep(0.0005 if count[0] % 2 else 0.003)

    m, _ = measure(
        noisy,
        lambda: None,
        warmup_s=0.0,
        min_warmup_calls=1,
        min_repeats=3,
        max_time_s=0.1,
        target_rel_iqr=0.001,
        min_block_s=0.0,
    )
    assert m.stopped_by == "time cap"


def test_interrupt_keeps_samples():
    count = [0]

    def fn():
        count[0] += 1
        if count[0] > 20:
            raise KeyboardInterrupt
        time.sleep(0.001)

    with pytest.raises(MeasurementInterrupted) as caught:
        measure(
            fn,
            lambda: None,
            warmup_s=0.0,
            min_warmup_calls=1,
            min_repeats=100,
            max_time_s=10,
            target_rel_iqr=0.0,
            min_block_s=0.0,
        )
    assert caught.value.measurement.samples_s  # what was measured before Ctrl-C survives
    assert caught.value.measurement.stopped_by == "interrupted"


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
    buffer, events = [0], []

    def fn():
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
        warmup_s=0.0,
        min_warmup_calls=1,
        min_repeats=3,
        max_time_s=0.05,
        target_rel_iqr=1.0,
        min_block_s=0.0,
        keep=lambda out: list(out),
        energy=Meter(),
    )
    assert kept == [1] and buffer[0] > 1
    assert m.energy_j == 3.0
    timed = events[events.index("start") + 1 : events.index("stop")]
    assert len(timed) == m.timed_calls() == len(m.samples_s) * m.block_size


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
        self.turns.append((samples["samples_s"], samples.get("sample_end_unix_s")))


# any spread satisfies (a loaded CI machine can spread three 0.2 ms sleeps by more than 100%)
FAST_TURNS = dict(warmup_s=0.0, min_warmup_calls=1, min_repeats=3, target_rel_iqr=float("inf"), min_block_s=0.0)


def test_turns_sample_only_when_given_a_turn_and_label_each_sample_with_its_round():
    turns = ScriptedTurns([1, 2, 7])
    ends = {"sample_end_unix_s": SampleEnd()}
    step = lambda: time.sleep(0.0002)  # noqa: E731
    m, _ = measure(step, lambda: None, max_time_s=0.3, rounds=3, turns=turns, series=ends, **FAST_TURNS)
    assert turns.ready_at == 0  # set up and warm, no sample yet
    # a turn samples to its end, spread met or not: the coordinator stops the rounds once the comparisons resolve
    counts = [len(samples) for samples, _ in turns.turns]
    assert len(counts) == 3 and min(counts) > 3
    assert m.samples.rounds == [1] * counts[0] + [2] * counts[1] + [7] * counts[2]
    assert m.samples_s == [s for samples, _ in turns.turns for s in samples]  # the turns' samples, pooled
    ends = m.samples.columns["sample_end_unix_s"]
    assert ends == sorted(ends) and len(ends) == sum(counts)


def test_a_turn_lasts_at_most_the_sampling_budget_over_the_rounds():
    turns = ScriptedTurns([1, 2])
    start = time.perf_counter()
    measure(
        lambda: time.sleep(0.001),
        lambda: None,
        max_time_s=0.4,
        rounds=4,
        turns=turns,
        series={"sample_end_unix_s": SampleEnd()},
        **{**FAST_TURNS, "target_rel_iqr": 0.0},  # the spread never satisfies: every turn runs to its cap
    )
    spans = [ends[-1] - ends[0] for _, ends in turns.turns]
    # the 0.4 s, less no warm-up, shared by 4 turns: 0.1 s each (uncapped, the first turn would use it all)
    assert all(0.07 < span < 0.15 for span in spans)
    assert time.perf_counter() - start < 0.4 + 0.3


def test_a_step_failing_in_a_later_turn_keeps_the_samples_of_the_earlier_ones():
    calls, failing = [0], [False]

    def fn():
        calls[0] += 1
        if failing[0]:
            raise RuntimeError("CUDA out of memory")

    class FailInRound3(ScriptedTurns):
        def wait(self):
            round_ = super().wait()
            failing[0] = round_ == 3
            return round_

    with pytest.raises(MeasurementFailed) as caught:
        measure(fn, lambda: None, max_time_s=0.3, rounds=4, turns=FailInRound3([1, 2, 3, 4]), **FAST_TURNS)
    assert set(caught.value.measurement.samples.rounds) == {1, 2}
    assert "CUDA out of memory" in str(caught.value.__cause__)


def test_a_job_whose_block_outlasts_a_turn_takes_fewer_rounds():
    assert affordable_rounds(40, sampling_s=4.0, block_s=0.002) == 40
    assert affordable_rounds(40, sampling_s=4.0, block_s=0.25) == 16  # a ResNet call: 16 turns of 0.25 s
    assert affordable_rounds(40, sampling_s=0.1, block_s=1.0) == 1
    # at 0.5 s a 2 ms block had one sample a turn in 40 rounds: now 14 turns of 8 blocks and a 5 ms re-warm
    assert affordable_rounds(40, sampling_s=0.3, block_s=0.002, warmup_s=0.2) == 14
    assert affordable_rounds(40, sampling_s=0.3, block_s=0.02, warmup_s=0.2) == 7  # not fewer than 8 blocks a turn
    turns = ScriptedTurns([1, 2])
    calls = [0]

    def slow():
        calls[0] += 1
        time.sleep(0.06)

    measure(slow, lambda: None, max_time_s=0.2, rounds=40, turns=turns, **{**FAST_TURNS, "warmup_s": 0.01})
    # calibration and warm-up (60 ms each at least) leave at most 80 ms of the 0.2 s: one block of 60 ms
    assert turns.affordable == 1
    calls_outside_samples = calls[0] - sum(len(samples) for samples, _ in turns.turns)
    assert calls_outside_samples == 3  # first call, calibration, warm-up; a 60 ms block needs no re-warm of 10 ms


def test_every_turn_starts_with_a_re_warm_of_a_block_unless_the_block_is_long():
    """A 10 ms block is longer than warmup_s / rounds (5 ms) but not a warm-up of its own: after the other
    jobs' turns the first block of a turn ran 23-61% slow (TensorFlow eager), so each turn re-warms one block
    before it samples."""
    calls = [0]

    def step():
        calls[0] += 1
        time.sleep(0.01)

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
    measure(step, lambda: None, max_time_s=0.6, rounds=3, turns=turns, **{**FAST_TURNS, "warmup_s": 0.015})
    assert turns.extra == [1, 1, 1]


def test_noise_within_turns_leaves_out_the_drift_between_rounds():
    """Round 2 ran twice as slow (a busy phase): the pooled IQR shows it, the spread within turns does not."""
    steady = [1.0, 1.01, 0.99, 1.0, 1.02]
    m = Measurement(0.0, Samples({"samples_s": steady + [2 * s for s in steady], "sample_round": [1] * 5 + [2] * 5}))
    assert m.rel_iqr() > 0.5 and m.turn_rel_iqr() < 0.03
    one_round = Measurement(0.0, Samples({"samples_s": steady}))
    assert one_round.turn_rel_iqr() == one_round.rel_iqr()

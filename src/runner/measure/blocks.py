"""Blocks of calls: timed between two clock reads, the block's size calibrated, warmed up; on a thread of their own
where the backend asks (runner.measure.timing's own_thread)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar, cast

Clock = Callable[[], float]  # seconds from any fixed point: time.perf_counter, or a test's fake clock
T = TypeVar("T")


class _Stop(BaseException):
    """Raised on the timing thread at its next block once the caller's wait was interrupted."""


@dataclass
class Timer:
    """The step, its device sync and the clock: times blocks of calls, with `own_thread` on a thread of their own
    (run()), a stretch of blocks at a time: a thread woken for every block made TensorFlow eager's short blocks
    16% slower (BENCHMARKS.md, parity process to process)."""

    fn: Callable[[], object]
    sync: Callable[[], None]
    clock: Clock
    own_thread: bool = False
    stopping: threading.Event = field(default_factory=threading.Event)

    def block(self, calls: int) -> float:
        """Seconds for `calls` calls, the device synced at both clock reads."""
        if self.stopping.is_set():
            raise _Stop
        self.sync()
        start = self.clock()
        for _ in range(calls):
            self.fn()
        self.sync()
        return self.clock() - start

    def run(self, work: Callable[..., T], *args: object) -> T:
        """work(*args); with own_thread on a new thread while this one waits. An interrupt of the wait (Ctrl-C,
        SIGTERM) stops that thread before its next block and is raised here once it has stopped."""
        if not self.own_thread:
            return work(*args)
        outcome: list[tuple[bool, object]] = []
        finished = threading.Event()  # not Thread.join: an interrupted join (3.11) marks a running thread stopped

        def target() -> None:
            try:
                outcome.append((True, work(*args)))
            except BaseException as error:  # raised on the caller's thread below
                outcome.append((False, error))
            finally:
                finished.set()

        thread = threading.Thread(target=target, name="runner-timed-calls", daemon=True)
        try:
            thread.start()  # the thread may be timing before start() returns
            finished.wait()
        except BaseException:
            self.stopping.set()  # a thread not started yet stops at its first block
            if thread.is_alive():
                finished.wait()  # until the block it is in ends
            raise
        finally:
            if finished.is_set():
                thread.join()
        done, value = outcome[0]
        if not done:
            raise cast(BaseException, value)
        return cast(T, value)


def warmed_block(
    timer: Timer, min_block_s: float, warmup_s: float, min_calls: int, until: float
) -> tuple[tuple[int, bool, float], tuple[int, bool, list[float]]]:
    """calibrate_block's answer, then warm_up's with that block: one stretch of blocks. Where any warm-up is asked,
    it makes at least one block whatever the budget (MIN_WARMUP_BLOCKS)."""
    found = calibrate_block(timer, min_block_s, until)
    asked = warmup_s > 0 or min_calls > 0
    return found, warm_up(timer, found[0], warmup_s, min_calls, until, MIN_WARMUP_BLOCKS if asked else 0)


def calibrate_block(timer: Timer, min_block_s: float, until: float) -> tuple[int, bool, float]:
    """Smallest call count (1, 2, 5, 10, 20, ...) whose block lasts at least min_block_s, whether it
    was found before `until` (else the largest count tried), and how long that block took."""
    calls = 1
    while True:
        for factor in (1, 2, 5):
            n = calls * factor
            seconds = timer.block(n)
            if seconds >= min_block_s:
                return n, True, seconds
            if timer.clock() >= until:
                return n, False, seconds
        calls *= 10


# Warm-up blocks made before `until` may cut warm-up short: under load one generation took 1.6 s, its calibration block
# alone spent the warm-up's half of the budget, and the one sample timed next was a cold call (its first tokens 216-486
# ms each, issue 77). A call that calibration timed is no warm call; one block more costs at most one block's time.
MIN_WARMUP_BLOCKS = 1


def warm_up(
    timer: Timer, block: int, warmup_s: float, min_calls: int, until: float, min_blocks: int = 0
) -> tuple[int, bool, list[float]]:
    """Calls made warming up, whether warm-up was complete before `until`, and each block's seconds; at least
    `min_blocks` blocks, however late (a turn's re-warm asks none: it may be 0 for long blocks)."""
    calls, start = 0, timer.clock()
    blocks_s: list[float] = []
    while calls < min_calls or timer.clock() - start < warmup_s:
        if timer.clock() >= until and len(blocks_s) >= min_blocks:
            return calls, False, blocks_s
        blocks_s.append(timer.block(block))
        calls += block
    return calls, True, blocks_s

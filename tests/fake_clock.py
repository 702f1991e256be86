"""A fake clock for the measurement loop's tests (pyperf tests its runner this way): time passes only when a
scripted call says so, so every decision the loop takes from the clock is the same on any machine."""

from __future__ import annotations

import itertools
from collections.abc import Callable


class FakeClock:
    """Seconds that stand still until `advance`; pass it as measure(clock=...)."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds

    def step(self, *durations: float, first: float | None = None) -> Callable[[], int]:
        """A workload whose calls take `durations` in turn, over and over (the first call `first`, where given);
        each returns how many calls were made so far."""
        cycle, calls = itertools.cycle(durations), 0

        def call() -> int:
            nonlocal calls
            calls += 1
            self.advance(first if calls == 1 and first is not None else next(cycle))
            return calls

        return call

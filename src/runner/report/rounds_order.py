"""The order a busy machine's paired rounds agree on, where they give no mean's interval.

On a machine another user keeps busy, a job's rounds spread far (one call 7x slower in some rounds), and the mean of
the per-round log ratios has no useful interval (runner.report.ratio.instability). The sign test needs no such
shape: the median per-round ratio's interval comes from order statistics whose ranks binomial(n, 1/2) gives, which
no stall can bias (runner.report.comparison.order_over_rounds turns it into a verdict). Simulated busy sweeps
(tests/test_comparison.py): a 5x difference ordered in 99% of 300, identical jobs in none.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from runner.report.ratio import PROCESS_SD
from runner.report.statistics import student_quantile


@dataclass(frozen=True)
class RoundsOrder:
    """What the paired rounds agree on: the median per-round ratio's interval, and how many rounds had it so."""

    low: float
    high: float
    agreeing: int  # rounds on the side the interval is on
    rounds: int  # rounds both were timed in

    @property
    def slower(self) -> bool:
        return self.low > 1


def rounds_order(mine: dict[int, float], theirs: dict[int, float], level: float) -> RoundsOrder | None:
    """The order of two jobs' typical times per round (round number -> seconds), paired by round: the sign test's
    interval for the median ratio at `level`, widened by the two processes' own offsets (PROCESS_SD each); None
    where it holds 1 or the rounds are too few for one."""
    shared = sorted(set(mine) & set(theirs))
    logs = np.log([mine[r] for r in shared]) - np.log([theirs[r] for r in shared])
    found = median_interval(logs, level)
    if found is None:
        return None
    margin = student_quantile(math.inf, (1 + level) / 2) * math.sqrt(2) * PROCESS_SD
    low, high = math.exp(found[0] - margin), math.exp(found[1] + margin)
    if low <= 1 <= high:
        return None
    agreeing = int(np.sum(logs > 0)) if low > 1 else int(np.sum(logs < 0))
    return RoundsOrder(low, high, agreeing, len(shared))


def median_interval(values: np.ndarray, level: float) -> tuple[float, float] | None:
    """The sign test's interval for the median of `values`: the order statistics whose ranks binomial(n, 1/2) gives,
    holding the median at `level` whatever the values' distribution; None where there are too few values for one
    (5 at 95%)."""
    from scipy.special import bdtr  # importing scipy.stats would slow every sweep's end

    n = len(values)
    cdf = bdtr(np.arange(n), n, 0.5)  # P(at most k of n below the median)
    below = np.flatnonzero(cdf <= (1 - level) / 2)
    if not len(below):
        return None
    k, ordered = int(below[-1]), np.sort(values)
    return float(ordered[k]), float(ordered[n - 1 - k])

"""A busy machine's rounds: why a job's disagree, and the order its paired rounds still agree on.

On a machine another user keeps busy, a job's rounds spread far (one call 7x slower in some rounds), and the mean of
the per-round log ratios has no useful interval (instability, which names the rounds that made the spread). The sign
test needs no such shape: the median per-round ratio's interval comes from order statistics whose ranks
binomial(n, 1/2) gives, which no stall can bias (runner.report.comparison.order_over_rounds turns it into a
verdict). Simulated busy sweeps (tests/test_comparison.py): a 5x difference ordered in 99% of 300, identical jobs in
none.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from runner.measure.samples import turn_typical
from runner.report.ratio import PROCESS_SD, UNSTABLE_SPREAD
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


def instability(samples_s: np.ndarray, rounds: np.ndarray | None) -> str | None:
    """Why a job's rounds disagree too much for a verdict (each turn's fastest sample, turn_typical, spread more
    than UNSTABLE_SPREAD, p90/p10), saying where they changed; None when they agree. Not the per-round medians: on
    a busy machine they spread 3-4x while the fastest samples held within 1% (BENCHMARKS.md)."""
    typical = turn_typical(samples_s, rounds)
    if len(typical) < 3:
        return None
    values = np.array([typical[r] for r in sorted(typical)])
    p10, p90 = np.percentile(values, [10, 90])
    if p90 / p10 <= UNSTABLE_SPREAD:
        return None
    return f"its per-round times spread {p90 / p10:.0f}x (p90/p10); {where_spread(typical, p90 / p10)}"


def where_spread(typical: dict[int, float], spread: float) -> str:
    """The rounds that made a job's spread: two levels where one change of the rounds' times (change_point) explains
    most of their variance (in logs), e.g. 'rounds 1-11 at 55 ms, 12-40 at 450 µs'; else the scattered rounds beyond
    the square root of the spread from the median, e.g. '5 slow rounds of 840 ms-1.2 s (4, 26, 27, 34, 39) and 1
    fast round of 15.7 ms (29) against 123 ms' (two levels 1.17x apart once named a spread of 12x that nine stalled
    rounds made)."""
    from runner.record.table import format_seconds

    before, after, explained = change_point(typical)
    if explained >= 0.5:
        return f"rounds {_span(before, typical)}, {_span(after, typical)}"
    middle, reach = float(np.median(list(typical.values()))), math.sqrt(spread)
    said = []
    for name, far in (("slow", lambda t: t > middle * reach), ("fast", lambda t: t < middle / reach)):
        found = sorted(r for r, t in typical.items() if far(t))
        if found:
            low, high = (format_seconds(f(typical[r] for r in found)) for f in (min, max))
            rounds = ", ".join(map(str, found))
            plural = "s" if len(found) > 1 else ""
            said.append(f"{len(found)} {name} round{plural} of {low if low == high else f'{low}-{high}'} ({rounds})")
    return f"{' and '.join(said)} against {format_seconds(middle)}"


def change_point(typical: dict[int, float]) -> tuple[list[int], list[int], float]:
    """The one split of a job's rounds into before and after that leaves the least squared spread of the log
    per-round times, and the share of their variance it explains."""
    numbers = sorted(typical)
    logs = np.log([typical[r] for r in numbers])
    costs = [logs[:i].var() * i + logs[i:].var() * (len(logs) - i) for i in range(1, len(logs))]
    split = int(np.argmin(costs)) + 1
    total = logs.var() * len(logs)
    return numbers[:split], numbers[split:], 1 - min(costs) / total if total > 0 else 0.0


def _span(part: list[int], typical: dict[int, float]) -> str:
    from runner.record.table import format_seconds

    level = format_seconds(float(np.median([typical[r] for r in part])))
    return f"{part[0]}-{part[-1]} at {level}" if len(part) > 1 else f"{part[0]} at {level}"

"""Where a series' levels change (asv's approach, its own code): the partition of a part of the series into constant
levels that minimises the weighted L1 distance of its log times from each level's weighted median, plus a penalty per
step, found exactly by dynamic programming; runner.history.steps sets the weights and the penalty, and tests each step.

L1 rather than squares: a single slow run among its neighbours (a busy machine; a 29% move between two sweeps in
BENCHMARKS.md's A/A apart) moves no median, and as the first and last levels must have MIN_SEGMENT points (the
newest level of the newest part aside: 1) and a level between two steps MIN_LEVEL, cutting out one stray point, or
two or three side by side, gains nothing (with heavy tails, 1 run in 12 moving 10-30%, two strays side by side the
same way made most false steps, each a pair of steps). A part of more than LONGEST points is fitted in windows of
LONGEST that overlap by half, each window's steps kept from its middle (a series of 1,000 runs: about 1 s)."""

from __future__ import annotations

import math

import numpy as np

from runner.report.statistics import weighted_median

MIN_SEGMENT = 2  # the fewest points in the first or the last level, the newest level aside (1: suspicious)
MIN_LEVEL = 4  # the fewest points in a level between two steps: two or three stray points side by side make none
LONGEST = 300  # the most points fitted at once: a longer part is fitted in overlapping windows (partition)


def _l1_costs(logs: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """costs[start, k]: the weighted L1 distance of logs[start:start + k] from their weighted median (inf beyond
    the series' end)."""
    n = len(logs)
    costs = np.full((n, n + 1), np.inf)
    for start in range(n):
        values, mass = logs[start:], weights[start:]
        inside = np.arange(len(values))[None, :] < np.arange(1, len(values) + 1)[:, None]  # row k - 1: the first k
        held = np.where(inside, mass[None, :], 0.0)
        median = weighted_median(values, held)
        costs[start, 1 : len(values) + 1] = (held * np.abs(values[None, :] - median[:, None])).sum(axis=1)
    return costs


def _optimal(logs: np.ndarray, weights: np.ndarray, penalty: float, single_last: bool) -> list[int]:
    """The first index of each level after the first, of the partition that minimises the weighted L1 cost plus
    `penalty` per step, exactly (dynamic programming): levels of MIN_SEGMENT points or more, the last of 1 where
    `single_last`."""
    n = len(logs)
    costs = _l1_costs(logs, weights)
    best = np.full(n + 1, np.inf)
    best[0] = -penalty
    previous = np.zeros(n + 1, dtype=int)
    for end in range(1, n + 1):
        shortest = 1 if end == n and single_last else MIN_SEGMENT
        starts = np.arange(0, end - shortest + 1)
        if end < n:  # a level between two steps
            starts = starts[(starts == 0) | (starts <= end - MIN_LEVEL)]
        if not len(starts):
            continue
        totals = best[starts] + costs[starts, end - starts] + penalty
        pick = int(np.argmin(totals))
        best[end], previous[end] = totals[pick], starts[pick]
    cuts, end = [], n
    while end > 0:
        end = int(previous[end])
        cuts.append(end)
    return sorted(cuts)[1:]


def partition(logs: np.ndarray, variances: np.ndarray, penalty: float, newest: bool) -> list[int]:
    """_optimal over a part, each point weighted sqrt(2) / its sd (Laplace noise of that sd); its last level may be
    a single run where it is the `newest` part. A part longer than LONGEST points is fitted in windows of LONGEST,
    each starting half a window after the last, each window's cuts kept from its middle half (its first and last
    quarters too where they are the part's ends)."""
    n, weights = len(logs), math.sqrt(2) / np.sqrt(variances)
    if n <= LONGEST:
        return _optimal(logs, weights, penalty, single_last=newest)
    quarter, cuts = LONGEST // 4, set()
    for start in range(0, n, 2 * quarter):
        end = min(start + LONGEST, n)
        found = _optimal(logs[start:end], weights[start:end], penalty, single_last=newest and end == n)
        keep = (start + quarter if start else 0, start + 3 * quarter if end < n else n)
        cuts |= {start + cut for cut in found if keep[0] <= start + cut < keep[1]}
        if end == n:
            break
    return sorted(cuts)

"""Steps in one case's history: where its typical time moved to a new level and stayed, by how much, and whether
that is a regression, an improvement, only suspicious, or too little data to say.

The series is one case on one machine, its runs in time order, each a typical time with (where it has one) an
interval. The detector works on log times, so a step is a ratio and noise is relative. `find_steps` is the entry.

- Replicates are one point (issue 81). Runs measured together (consecutive runs of one `group`: a sweep's seeds of
  one configuration, its processes, its nodes of one kind) share their moment of the machine and come out nearly
  equal; read as runs in a row they would look like a series correlated at lag 1, and their small differences like
  a quiet machine. So the runs of a group are one point of the series: the mean of their log times, their spread
  that point's own (their variance over their number). A step's index is its point's first run.
- The noise between points comes from the scatter the series shows: sd is where the squared differences between
  consecutive points, each over its expected variance and capped at CAP, average what a capped chi-square with 1
  degree of freedom does: a step spoils one difference, a stray point two, and the cap keeps either from counting
  for more than a 2-sigma difference. Its degrees of freedom: von Neumann's 2 (n - 1)^2 / (3n - 4) for n points in a
  row, times CAPPED_EFFICIENCY. Each point's variance is sd^2 plus FLOOR^2 (no timing is known better than 0.1%)
  plus its excess: what its own variance, by its runs' intervals (a 95% interval on the log scale: half its width
  over 1.96; of a group's mean: over its runs) or by its replicates' spread, holds beyond the median point's, the
  larger of the two. A run's interval (its within-run noise, or the spread runs made apart are expected to have)
  thus enters only where it is wider than the other points' (a run of fewer processes, a sweep whose seeds
  disagreed): intervals wider than the scatter itself say nothing the scatter does not, as the scatter shows.
  The fit takes the sd of all consecutive differences; each step is then tested at the sd of the differences
  within the levels the fit found (never across a step being tested), their degrees of freedom counted per level.
- Points correlated in time (slow phases of the machine, a load that outlasts a sweep): rho, the lag-1
  autocorrelation of the points within their levels (each point's distance from its level over its sd, pulled in
  to OUTLYING so that a stray point weighs no more than 3 sds; the sum of neighbours' products over the sum of
  squares, plus levels / points, the bias of a correlation about estimated means), shrunk by its sampling noise (an
  estimate r of n points, whose sd is about 1 / sqrt(n) where there is no correlation, counts for r (1 - 1 / (n
  r^2)), none within one sd of 0: in issue 81's 12 sweeps, 0.31 is 1.1 sds from none and counts for 0.05), held
  to [0, RHO_MAX]. Each level's standard error grows by sqrt(_inflation): an AR(1) mean of m points varies (1 + 2
  sum_k (1 - k/m) rho^k) times as much as an independent one, and sd from consecutive differences saw only (1 - rho)
  of the variance. At rho 0 nothing changes.
- The fit (asv's approach, its own code): runner.history.partition, each point weighted by sqrt(2) / its sd
  (the likelihood of Laplace noise of that sd), with the penalty per step below.
- Which steps are real, the default threshold: a step's size is the difference of the typical log times of the
  levels either side (each level's weighted mean, weights 1 / variance, its points first pulled in to OUTLYING sds
  of its weighted median where it has 3 or more), and its standard error comes from their points' variances (and
  rho, above). A step is kept where its p-value (below) is at most KEEP (2%): the chance that a part with no step
  shows one so large anywhere the search looked. The fit's penalty per step is half the square of the standard
  errors that takes. That is the smallest change this series' noise resolves at that place: in 40 runs that
  scatter 3.2% (ratio.APART_SD and PROCESS_SD together), a step with 20 runs either side must be 3.9%, with 2 runs
  after it 9.1%, with 1 run after it 13% (at rho 0); in 12 sweeps that scatter 3%, a step at the 7th 8.3%. A single
  newest point after a step must besides lie further from the level before it, in its own sds, than any earlier
  point lies from its own level: where the series has had points stray that far, one more is no evidence of a
  step. The weakest step short of it is merged away and the others measured again, until every step left is
  resolved. `threshold` (0.05: 5%, either way: |log ratio| >= log 1.05) adds a floor on a step's size; a step the
  noise does not resolve is never kept, whatever the threshold. KEEP replaced a threshold of sqrt(2 ln n) standard
  errors (the Schwarz criterion): with the noise taken from the series and its degrees of freedom counted as they
  are, that let 0.25 false steps per 100 runs through on normal noise, 0.22 on heavy, 1.16 on runs correlated 0.3
  (300 simulated series each; 0.08, 0.15 and 0.51 before issue 81).
- The p-value of a step: |size| / se as the normal deviate b of the same two-sided Student t tail at the noise's
  degrees of freedom, bounded over the places the fit could have put a step in its part (MIN_SEGMENT points either
  side, or the newest point alone: `_places`) by Hunter's chain: P(max |Z| > b) <= 2 (Q(b) + sum_k P(Z_k <= b <
  Z_k+1)), each term 2 Owen's T(b, sqrt((1 - r_k) / (1 + r_k))), r_k the correlation of the test at neighbouring
  places (sqrt(W_k (1 - W_k+1) / (W_k+1 (1 - W_k))), W_k the share of the part's weight before place k), capped at
  1. It is never above Bonferroni's bound (the tail times the places), the bound before issue 81, and well below it
  where the places are many and their tests alike. It holds where the noise is as the detector assumes and is too
  small where points are correlated or a few move far (BENCHMARKS.md, "History: many cases at once"). The search
  over the levels' other ends is not counted. runner.history.build adjusts these over a store's series
  (Benjamini-Hochberg).
- The interval of a step: the ratio after / before, exp(size), with a 95% (statistics.LEVEL) interval, Student's t
  on the standard error above. Steps found by a search are the larger ones: on simulated series the intervals of
  steps near the resolution held the true ratio less often than 95% (BENCHMARKS.md).
- The labels: a step with at least 2 points after it is a REGRESSION (slower) or an IMPROVEMENT (faster). A step
  with only the newest point after it (and further out than any before it, above) is SUSPICIOUS, either way
  (TorchBench: two violations in a row at the end make a regression, one does not). Where the newest part of the
  series has fewer than MIN_POINTS points (2 either side of a step), the list ends with an INSUFFICIENT step at that
  part's first run, its ratio and interval NaN; an empty series gives that step at index 0.
- Known changes: a run marked `known_change` (a new machine, a new version a curator expects to differ) starts
  a new part at its point; each part is fitted alone (their noise estimated together), so no step is reported at a
  mark. An older part of fewer than MIN_POINTS points is not examined.

Runs whose typical time is not a positive number are left out (a mark on one moves to the next run); the steps'
indices are those of `points`. BENCHMARKS.md, "History: finding steps", has the detection rate, the false alarms and
the error in the position on simulated series (normal, heavy-tailed and correlated noise, and store-shaped sweeps of
replicates with wide intervals, a load that comes and goes and a drift), beside Apache Otava's detector and PELT on
the same series (benchmarks/history_sim.py).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum

import numpy as np
from scipy.special import chdtr, chdtrc, chdtri, ndtr, ndtri, owens_t

from runner.history.partition import MIN_SEGMENT, partition
from runner.report.statistics import LEVEL, pulled_in, student_p_value, student_quantile, weighted_median

MIN_POINTS = 4  # a part of fewer points is insufficient data: 2 either side of a step
RHO_MAX = 0.8  # the largest lag-1 autocorrelation of points taken from a series
FLOOR = 0.001  # the smallest sd of a log time: no timing is known better than 0.1%
CAP = float(chdtri(1, 0.05))  # a squared difference counts for at most this many times its expected variance
# E min(X, CAP) for X chi-square with 1 degree of freedom: P(chi2_3 < CAP) + CAP P(chi2_1 >= CAP), as x f_1(x) = f_3(x)
CAPPED_MEAN = float(chdtr(3, CAP) + CAP * chdtrc(1, CAP))
# The capped mean of squared differences, against the plain one, on normal noise: its variance over theirs (von
# Neumann's 2 (n - 1)^2 / (3n - 4) degrees of freedom) measured 0.89-1.0 for 6-60 points (4,000 series each).
CAPPED_EFFICIENCY = 0.9
KEEP = 0.02  # a step is kept where its p-value is at most this (see the module's docstring)


@dataclass(frozen=True)
class Point:
    """One run of the series, in time order."""

    typical_s: float  # its typical time
    low_s: float  # its interval's bounds on the time (NaN where it has none)
    high_s: float
    known_change: bool = False  # a curator's mark: the distribution changes here, no alert at this point
    group: str = ""  # runs measured together (one sweep): consecutive runs of one group are one point of the series


class Label(StrEnum):
    REGRESSION = "regression"
    IMPROVEMENT = "improvement"
    SUSPICIOUS = "suspicious"
    INSUFFICIENT = "insufficient data"
    NUMERIC = "numeric change"  # a step in a run's numbers, not its time (runner.history.build; never find_steps')
    BUSY = "busy machine"  # a step load alone could make, beside runs measured busy (runner.history.build)


@dataclass(frozen=True)
class Step:
    index: int  # the first run after the step (of `points`; where runs were measured together, the group's first)
    ratio: float  # after / before (typical times of the levels)
    low: float  # its interval
    high: float
    label: Label
    p_value: float = math.nan  # the chance of so large a step in its part where it has none (_p_value); NaN: none
    q_value: float = math.nan  # its p-value adjusted over a store's cases (runner.history.build.control_fdr)
    significant: bool = True  # False: its q-value is above the store's false-discovery rate: shown, no alert
    before: float = math.nan  # the typical value of the level before it (its ratio's denominator); NaN: no level


@dataclass(frozen=True)
class _Series:
    logs: np.ndarray  # each point's log typical time (a group's: the mean of its runs')
    excess: np.ndarray  # each point's own variance beyond the median point's (_own_variances), 0 where none is known
    index: np.ndarray  # each point's first run's index in `points`
    parts: tuple[tuple[int, int], ...]  # [start, end) of each part between known changes


@dataclass
class _Gathered:
    """The usable runs of one point of the series, as they are read."""

    first: int  # the first run's index in `points`
    group: str
    marked: bool
    logs: list[float] = field(default_factory=list)
    sds: list[float] = field(default_factory=list)  # each run's own sd from its interval (NaN: none)


def find_steps(points: Sequence[Point], threshold: float | None = None) -> list[Step]:
    """The steps in one case's series (see the module's docstring), in time order; the last is INSUFFICIENT where
    the newest part is too short to tell. `threshold`: the smallest step reported (0.05: 5%, either way), besides
    the smallest that the series' noise resolves."""
    series = _series(points)
    floor = math.log1p(threshold) if threshold else 0.0
    steps = _fit(series, floor)
    newest = series.parts[-1] if series.parts else (0, 0)
    if newest[1] - newest[0] < MIN_POINTS:
        first = int(series.index[newest[0]]) if newest[1] > newest[0] else 0
        steps.append(Step(first, math.nan, math.nan, math.nan, Label.INSUFFICIENT))
    return steps


def _fit(series: _Series, floor: float) -> list[Step]:
    """The steps resolved in each part of MIN_POINTS or more: the levels fitted at the scatter of all consecutive
    points, then each step tested at the scatter within the levels found (see the module's docstring)."""
    fitted = [(start, end) for start, end in series.parts if end - start >= MIN_POINTS]
    extra, df = _noise(series, [])
    cuts = {}
    for part in fitted:
        logs, variances = _part(series, part, extra)
        newest = part[1] == len(series.logs)
        cuts[part] = partition(logs, variances, _needed(df, _places(variances, newest)) ** 2 / 2, newest)
    extra, df = _noise(series, [start + cut for (start, _), found in cuts.items() for cut in found])
    steps: list[Step] = []
    for (start, end), found in cuts.items():
        logs, variances = _part(series, (start, end), extra)
        places = _places(variances, end == len(series.logs))
        for step in _resolved(logs, variances, found, _needed(df, places), floor, df, places):
            steps.append(replace(step, index=int(series.index[start + step.index])))
    return steps


def _part(series: _Series, part: tuple[int, int], extra: float) -> tuple[np.ndarray, np.ndarray]:
    """A part's log times and their variances, its points scattering `extra` sd between them."""
    start, end = part
    return series.logs[start:end], extra**2 + series.excess[start:end] + FLOOR**2


def _needed(df: float, places: np.ndarray) -> float:
    """The standard errors a step must reach to be kept: where its p-value over these `places` (_p_value) is KEEP."""
    low, high = 0.0, 1.0
    while _p_value(high, df, places) > KEEP:
        low, high = high, 2 * high
    for _ in range(50):
        middle = (low + high) / 2
        low, high = (middle, high) if _p_value(middle, df, places) > KEEP else (low, middle)
    return high


def _series(points: Sequence[Point]) -> _Series:
    """The series' points (each run, or the runs of one group together), their log times and excess variances, and
    the parts that known changes split them into."""
    gathered = _gather(points)
    logs = np.array([np.mean(g.logs) for g in gathered], dtype=float)
    excess = np.maximum(*(_excess(own) for own in _own_variances(gathered)))
    starts = [i for i, g in enumerate(gathered) if g.marked and i]
    edges = [0, *starts, len(gathered)]
    parts = tuple((a, b) for a, b in zip(edges[:-1], edges[1:], strict=True) if b > a)
    return _Series(logs, excess, np.array([g.first for g in gathered], dtype=int), parts)


def _gather(points: Sequence[Point]) -> list[_Gathered]:
    """The usable runs (a positive typical time), consecutive runs of one group together; a known change marks the
    point its run belongs to, or where the run is not usable, the next point."""
    gathered: list[_Gathered] = []
    marked, z95 = False, student_quantile(math.inf, (1 + LEVEL) / 2)
    for i, point in enumerate(points):
        marked = marked or point.known_change
        if not (math.isfinite(point.typical_s) and point.typical_s > 0):
            continue
        if not (gathered and point.group and point.group == gathered[-1].group):
            gathered.append(_Gathered(i, point.group, False))
        gathered[-1].marked |= marked
        marked = False
        low, high = point.low_s, point.high_s
        usable = math.isfinite(low) and math.isfinite(high) and 0 < low <= high
        gathered[-1].logs.append(math.log(point.typical_s))
        gathered[-1].sds.append((math.log(high) - math.log(low)) / (2 * z95) if usable else math.nan)
    return gathered


def _own_variances(gathered: list[_Gathered]) -> tuple[np.ndarray, np.ndarray]:
    """Each point's own variance of its log time by its runs' intervals (of their mean), and by its replicates'
    spread (a group's: their variance over their number); NaN where it has none."""
    intervals, spreads = [], []
    for point in gathered:
        runs, sds = len(point.logs), np.array(point.sds)
        intervals.append(float(np.mean(sds[np.isfinite(sds)] ** 2)) / runs if np.isfinite(sds).any() else math.nan)
        spreads.append(float(np.var(point.logs, ddof=1)) / runs if runs > 1 else math.nan)
    return np.array(intervals, dtype=float), np.array(spreads, dtype=float)


def _excess(own: np.ndarray) -> np.ndarray:
    """Each point's own variance beyond the median point's: what its interval (or its replicates' spread) says it
    holds that the scatter of the series, of which the median point's own noise is part, does not (0 where its own
    is not known)."""
    if not np.isfinite(own).any():
        return np.zeros(len(own))
    return np.where(np.isfinite(own), np.maximum(own - np.nanmedian(own), 0.0), 0.0)


def _noise(series: _Series, cuts: list[int]) -> tuple[float, float]:
    """The sd (log scale) of the points' scatter about their levels, from consecutive points' differences within
    parts and within the levels that start at `cuts`, beside the points' excess variances (see the module's
    docstring), and its degrees of freedom (_difference_df), at least 1."""
    edges = sorted({edge for part in series.parts for edge in part} | set(cuts))
    levels = [(a, b) for a, b in zip(edges[:-1], edges[1:], strict=True) if b - a > 1]
    if not levels:
        return 0.0, 1.0
    squares = np.concatenate([np.diff(series.logs[a:b]) ** 2 for a, b in levels])
    known = np.concatenate([series.excess[a : b - 1] + series.excess[a + 1 : b] + 2 * FLOOR**2 for a, b in levels])
    df = sum(_difference_df(b - a) for a, b in levels)
    return _extra_sd(squares, known, 2.0), max(df, 1.0)


def _difference_df(points: int) -> float:
    """The degrees of freedom of a variance from the capped squared differences of `points` consecutive points: von
    Neumann's 2 (n - 1)^2 / (3n - 4) for the plain mean of squared differences, times CAPPED_EFFICIENCY."""
    return CAPPED_EFFICIENCY * 2 * (points - 1) ** 2 / (3 * points - 4) if points > 1 else 0.0


def _extra_sd(squares: np.ndarray, known: np.ndarray, scale: float) -> float:
    """The sd whose variance, `scale` times, beside the variances `known`, gives the capped squares their expected
    mean: mean(min(square / (scale extra^2 + known), CAP)) = CAPPED_MEAN (0 where the known variances already give
    less). The mean falls as the variance grows: bisection."""

    def excess(extra: float) -> float:
        return float(np.mean(np.minimum(squares / (scale * extra + known), CAP))) - CAPPED_MEAN

    if excess(0.0) <= 0:
        return 0.0
    low, high = 0.0, float(squares.max()) / (scale * CAPPED_MEAN)  # there every term is at most CAPPED_MEAN
    for _ in range(60):
        middle = (low + high) / 2
        low, high = (middle, high) if excess(middle) > 0 else (low, middle)
    return math.sqrt((low + high) / 2)


def _level(logs: np.ndarray, variances: np.ndarray) -> tuple[float, float]:
    """A level's typical log time and its standard error: the weighted mean (weights 1 / variance) of its points,
    each first pulled in to OUTLYING sds of their weighted median where there are 3 or more."""
    weights = 1 / variances
    if len(logs) >= 3:
        logs = pulled_in(logs, float(weighted_median(logs, weights)), np.sqrt(variances))
    return float(np.sum(weights * logs) / np.sum(weights)), float(1 / math.sqrt(np.sum(weights)))


def _resolved(
    logs: np.ndarray,
    variances: np.ndarray,
    starts: list[int],
    needed: float,
    floor: float,
    df: float,
    places: np.ndarray,
) -> list[Step]:
    """The steps that the noise resolves and that reach `floor` (log scale), the weakest of the others merged
    away first (their indices those of `logs`), each with its p-value over the `places` the search tried (_p_value)."""
    starts = list(starts)
    while starts:
        sizes, errors, margin, levels = _measured(logs, variances, starts, needed, floor)
        if margin.min() >= 1:
            break
        del starts[int(np.argmin(margin))]
    if not starts:
        return []
    quantile = student_quantile(df, (1 + LEVEL) / 2)
    steps = []
    for at, size, error, before in zip(starts, sizes, errors, levels[:-1], strict=True):
        label = Label.REGRESSION if size > 0 else Label.IMPROVEMENT
        if at == len(logs) - 1:
            label = Label.SUSPICIOUS
        low, high = math.exp(size - quantile * error), math.exp(size + quantile * error)
        p_value = _p_value(abs(size) / error, df, places)
        steps.append(Step(at, math.exp(size), low, high, label, p_value, before=math.exp(before)))
    return steps


def _measured(
    logs: np.ndarray, variances: np.ndarray, starts: list[int], needed: float, floor: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[float]]:
    """Each step's size, its standard error (each level's inflated for runs correlated within it: _inflation), its
    margin: |size| over what it must reach (needed standard errors, and `floor`), below 1 where it falls short (a
    single newest run's also its distance from the level before over the farthest earlier run's from its own), and
    each level's typical log time."""
    edges = [0, *starts, len(logs)]
    spans = list(zip(edges[:-1], edges[1:], strict=True))
    levels = [_level(logs[a:b], variances[a:b]) for a, b in spans]
    scaled = [(logs[a:b] - level) / np.sqrt(variances[a:b]) for (a, b), (level, _) in zip(spans, levels, strict=True)]
    rho = _autocorrelation(scaled)
    ses = [se * math.sqrt(_inflation(b - a, rho)) for (a, b), (_, se) in zip(spans, levels, strict=True)]
    sizes = np.diff([level for level, _ in levels])
    errors = np.hypot(ses[:-1], ses[1:])
    margin = np.abs(sizes) / np.maximum(needed * errors, floor)
    if starts[-1] == len(logs) - 1:  # the newest run alone: further out than any run before it
        farthest = max(float(np.max(np.abs(r))) for r in scaled[:-1])
        if farthest > 0:  # runs alike before it: any move of the newest is further out, its margin stands
            margin[-1] = min(margin[-1], abs(logs[-1] - levels[-2][0]) / math.sqrt(variances[-1]) / farthest)
    return sizes, errors, margin, [level for level, _ in levels]


def _autocorrelation(scaled: list[np.ndarray]) -> float:
    """The lag-1 autocorrelation of the points within their levels, from their scaled residuals (each pulled in to
    OUTLYING), shrunk by its own sampling noise, in [0, RHO_MAX] (see the module's docstring)."""
    pulled = [pulled_in(r, 0.0, 1.0) for r in scaled]
    products = sum(float(np.sum(r[:-1] * r[1:])) for r in pulled)
    squares = sum(float(np.sum(r**2)) for r in pulled)
    points = sum(len(r) for r in pulled)
    if not squares or products <= 0:
        return 0.0
    rho = products / squares + len(pulled) / points
    return min(rho * max(1 - 1 / (points * rho**2), 0.0), RHO_MAX)


def _inflation(runs: int, rho: float) -> float:
    """How much more a level's mean varies where its runs are correlated rho at lag 1 (AR(1)) than where they are
    independent, its runs' variances taken from consecutive differences (which see (1 - rho) of the variance):
    (1 + 2 sum_k (1 - k / runs) rho^k) / (1 - rho)."""
    return (1 + 2 * rho / (1 - rho) - 2 * rho * (1 - rho**runs) / (runs * (1 - rho) ** 2)) / (1 - rho)


def _places(variances: np.ndarray, newest: bool) -> np.ndarray:
    """Where a fit of a part can put a step (MIN_SEGMENT points either side, or a single newest point after it in
    the newest part), each as the share of the part's weight (1 / variance) before it."""
    before = np.cumsum(1 / variances)
    last = len(variances) - MIN_SEGMENT + (newest and MIN_SEGMENT > 1)
    return before[MIN_SEGMENT - 1 : max(last, MIN_SEGMENT)] / before[-1]


def _p_value(t: float, df: float, places: np.ndarray) -> float:
    """The p-value of a step `t` standard errors in size, from the test that keeps it, over the `places` the search
    tried: two-sided Student t at the noise's degrees of freedom, as the normal deviate of the same tail, bounded
    over the places by Hunter's chain (see the module's docstring); capped at 1."""
    deviate = -float(ndtri(student_p_value(t, df) / 2))
    share = np.clip(places, 1e-12, 1 - 1e-12)
    neighbours = np.sqrt(share[:-1] * (1 - share[1:]) / (share[1:] * (1 - share[:-1])))
    crossings = 2 * owens_t(deviate, np.sqrt((1 - neighbours) / (1 + neighbours)))
    return min(1.0, 2 * (float(ndtr(-deviate)) + float(np.sum(crossings))))

"""The statistics the comparisons and the history share, each written once: Student's t quantile and its two-sided
p-value, the weighted median, a value pulled in to a bound either side of its centre, and the spans of the levels either
side of a change in a series.

scipy.special rather than scipy.stats: importing scipy.stats would slow every sweep's end (and `stdtrit` at infinite
degrees of freedom is the normal's quantile)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

LEVEL = 0.95  # every interval's level: a comparison's (shared among those made at once), a step's in a history
OUTLYING = 3.0  # sds from the centre beyond which a value is pulled in (pulled_in): a round's log ratio, a level's run


def student_quantile(df: float, probability: float) -> float:
    """Student's t quantile at `df` degrees of freedom (the normal's where df is infinite), for every interval and test
    of the comparisons and the history."""
    from scipy.special import stdtrit

    return float(stdtrit(df, probability))


def student_p_value(t: float, df: float) -> float:
    """The two-sided p-value of `t` under Student's t at `df` degrees of freedom (the normal's where df is infinite)."""
    from scipy.special import stdtr

    return float(2 * stdtr(df, -abs(t)))


def weighted_median(values: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """The weighted median of `values`: the smallest value whose share of the weight, with the smaller values', reaches
    half. `weights` may hold a row of weights per median wanted (the last axis matching `values`): one per row."""
    order = np.argsort(values, kind="stable")
    cumulative = np.cumsum(np.asarray(weights)[..., order], axis=-1)
    return np.asarray(values)[order][np.argmax(cumulative >= cumulative[..., -1:] / 2, axis=-1)]


def pulled_in(values: np.ndarray, centre: float | np.ndarray, sds: float | np.ndarray) -> np.ndarray:
    """`values` with those beyond OUTLYING `sds` of `centre` pulled in to that bound: an outlying value moves a mean by
    the bound, not by its size."""
    return np.clip(values, centre - OUTLYING * np.asarray(sds), centre + OUTLYING * np.asarray(sds))


def either_side(starts: Sequence[int], at: int, end: int) -> tuple[slice, slice]:
    """The level before the change at index `at` and the level after it, among changes at `starts` in a series of
    `end` points: from the change before it (or the first point) to it, and from it to the next (or the end)."""
    start = max((i for i in starts if i < at), default=0)
    stop = min((i for i in starts if i > at), default=end)
    return slice(start, at), slice(at, stop)

"""How much slower job A is than job B, with a 95% interval that accounts for the spread between rounds.

Each round gives one median per job. Jobs measured in the same rounds (interleaved: round r of A and
of B met the same phase of the machine) are compared round by round: the ratio is the geometric mean
of the per-round ratios, so the round-to-round drift of the machine cancels and its spread widens the
interval.

The interval is Student's t over batch means: consecutive rounds are grouped into batches (every round
its own batch up to MIN_BATCHES rounds, then MIN_BATCHES or sqrt(rounds) batches) and t runs over the
batches' means. Rounds close in time are not independent draws: on a busy machine the slow and fast
phases outlast a round, and per-round log ratios correlated up to 0.5 at lag 1 (BENCHMARKS.md). Over
single rounds, t then held the true ratio in about 85% of simulated sweeps (40 rounds, lag-1
correlation 0.3) instead of 95%; over batches, 94% (tests/test_ratio.py checks both).

All rounds count, busy or quiet: keeping only the quiet ones (no other process runnable during either
turn) was tried and made the ratio move more between repeats, not less, since it halved the rounds
under a neighbour that is busy half the time (BENCHMARKS.md). How busy the machine was is reported
beside the ratio instead.

Jobs measured in different rounds fall back to Welch's t over the two sets of batch means. One round
gives the ratio of medians and no interval.

Why t rather than a bootstrap over rounds: with few rounds a percentile bootstrap has too few distinct
resamples; in a simulation (3 rounds, log-normal round effects) its 95% interval held the true ratio
80% of the time, t's 95%.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

LEVEL = 0.95
MIN_BATCHES = 8


@dataclass(frozen=True)
class Ratio:
    value: float  # time of A / time of B
    low: float  # the 95% interval; NaN when there are too few rounds to tell
    high: float
    rounds: int  # the rounds the interval rests on (shared rounds when paired)
    paired: bool

    def basis(self) -> str:
        """What the ratio rests on, for a person: '40 rounds', '1 round', '5 rounds, unpaired'."""
        unpaired = ", unpaired" if not self.paired and self.rounds > 1 else ""
        return f"{self.rounds} round{'s' if self.rounds != 1 else ''}{unpaired}"

    def within_noise(self) -> str:
        """'yes' when the interval holds 1, 'no' when it does not, else why it cannot tell."""
        if math.isnan(self.low):
            return f"cannot tell ({self.rounds} round{'s' if self.rounds != 1 else ''})"
        return "yes" if self.low <= 1.0 <= self.high else "no"


def round_medians(samples_s: np.ndarray, rounds: np.ndarray | None) -> dict[int, float]:
    """The median sample of each round (all samples are round 1 where rounds were not recorded)."""
    samples_s = np.asarray(samples_s, dtype=float)
    rounds = np.ones(len(samples_s), dtype=int) if rounds is None else np.asarray(rounds)
    return {int(r): float(np.median(samples_s[rounds == r])) for r in np.unique(rounds)}


def batch_count(rounds: int) -> int:
    """How many batches of consecutive rounds the interval rests on (see the module's docstring)."""
    return min(rounds, max(MIN_BATCHES, math.isqrt(rounds)))


def batch_means(logs: np.ndarray) -> np.ndarray:
    """The means of consecutive per-round values in batch_count(len(logs)) batches, as even as they split."""
    return np.array([batch.mean() for batch in np.array_split(np.asarray(logs, dtype=float), batch_count(len(logs)))])


def time_ratio(
    samples_a: np.ndarray,
    rounds_a: np.ndarray | None,
    samples_b: np.ndarray,
    rounds_b: np.ndarray | None,
) -> Ratio:
    """A's time relative to B's, with its 95% interval (see the module's docstring)."""
    a, b = round_medians(samples_a, rounds_a), round_medians(samples_b, rounds_b)
    shared = sorted(set(a) & set(b))
    if len(shared) >= 2:
        logs = np.log([a[r] for r in shared]) - np.log([b[r] for r in shared])
        batches = batch_means(logs)
        mean, half = logs.mean(), _half_width(batches.std(ddof=1) / math.sqrt(len(batches)), len(batches) - 1)
        return Ratio(math.exp(mean), math.exp(mean - half), math.exp(mean + half), len(shared), paired=True)
    log_a, log_b = np.log([a[r] for r in sorted(a)]), np.log([b[r] for r in sorted(b)])
    if len(log_a) >= 2 and len(log_b) >= 2:
        mean = log_a.mean() - log_b.mean()
        batches_a, batches_b = batch_means(log_a), batch_means(log_b)
        var_a, var_b = batches_a.var(ddof=1) / len(batches_a), batches_b.var(ddof=1) / len(batches_b)
        sem = math.sqrt(var_a + var_b)
        if sem == 0:
            return Ratio(math.exp(mean), math.exp(mean), math.exp(mean), min(len(a), len(b)), paired=False)
        df = (var_a + var_b) ** 2 / (var_a**2 / (len(batches_a) - 1) + var_b**2 / (len(batches_b) - 1))  # Welch
        half = _half_width(sem, df)
        return Ratio(math.exp(mean), math.exp(mean - half), math.exp(mean + half), min(len(a), len(b)), paired=False)
    value = float(np.median(samples_a) / np.median(samples_b))
    return Ratio(value, math.nan, math.nan, min(len(a), len(b)), paired=False)


def _half_width(sem: float, df: float) -> float:
    """Half the 95% interval of a mean with this standard error and these degrees of freedom (Student's t)."""
    from scipy import stats

    return float(stats.t.ppf((1 + LEVEL) / 2, df) * sem)

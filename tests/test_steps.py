"""Steps in a case's history (runner.history.steps) on series whose truth is known: seeded, so every run gives the
same answer, and with the rates over many series held to targets well clear of what they are (BENCHMARKS.md,
"History: finding steps", has the detector against the noise of real runs)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from runner.history import partition
from runner.history import steps as steps_module
from runner.history.series import apart_interval
from runner.history.steps import Label, Point, Step, find_steps


def series(
    seed: int, n: int = 20, at: int | None = None, ratio: float = 1.0, sd: float = 0.01, half: float = 0.02
) -> list[Point]:
    """n runs of 1 ms whose log times scatter by `sd`, each with a 95% interval of +-`half` (log scale) about its
    time, `ratio` times slower from `at` on."""
    rng = np.random.default_rng(seed)
    logs = math.log(1e-3) + rng.normal(0, sd, n)
    if at is not None:
        logs[at:] += math.log(ratio)
    return [Point(*np.exp([y, y - half, y + half]).tolist()) for y in logs]


def slow(points: list[Point], index: int, factor: float) -> list[Point]:
    """The series with one run `factor` times slower."""
    p = points[index]
    return [*points[:index], Point(p.typical_s * factor, p.low_s * factor, p.high_s * factor), *points[index + 1 :]]


def test_a_10_percent_step_in_20_runs_is_a_regression_at_its_place_whose_interval_holds_it():
    (step,) = find_steps(series(seed=1, at=10, ratio=1.10))
    assert (step.index, step.label) == (10, Label.REGRESSION)
    assert step.low <= 1.10 <= step.high
    assert 1.07 < step.ratio < 1.13


def test_a_10_percent_step_is_found_at_its_place_in_every_seeded_series_its_interval_holding_it_mostly():
    found = [[s for s in find_steps(series(seed, at=10, ratio=1.10)) if s.index == 10] for seed in range(100)]
    assert all([s.label for s in steps] == [Label.REGRESSION] for steps in found)
    assert sum(steps[0].low <= 1.10 <= steps[0].high for steps in found) >= 85  # a 95% interval: 94 of 100 here
    alone = sum(len(find_steps(series(seed, at=10, ratio=1.10))) == 1 for seed in range(100))
    assert alone >= 90  # a noise step beside it in none of 100 here


def test_a_faster_level_is_an_improvement():
    (step,) = find_steps(series(seed=2, n=24, at=12, ratio=1 / 1.10))
    assert (step.index, step.label) == (12, Label.IMPROVEMENT)
    assert step.high < 1 and step.low <= 1 / 1.10 <= step.high


def test_a_flat_noisy_series_has_no_step():
    assert find_steps(series(seed=3, n=40, sd=0.03)) == []


def test_flat_noisy_series_raise_few_false_alarms():
    """Few false steps in these 1,200 runs (none here; a step is kept at p <= 2% over the places searched): the
    simulations' 30-60 runs gave 0.01-0.04 per 100 (BENCHMARKS.md). 1 per 100 would be 12."""
    runs = [series(seed, n=30, sd=0.03) for seed in range(40)]
    alarms = sum(len(find_steps(points)) for points in runs)
    assert alarms / sum(map(len, runs)) < 0.01


def test_one_slow_run_at_the_end_is_suspicious_two_are_a_regression():
    flat = series(seed=4)
    (step,) = find_steps(slow(flat, 19, 1.3))
    assert (step.index, step.label) == (19, Label.SUSPICIOUS)
    assert step.ratio > 1.2
    (step,) = find_steps(slow(slow(flat, 18, 1.3), 19, 1.3))
    assert (step.index, step.label) == (18, Label.REGRESSION)


def test_one_slow_run_in_the_middle_is_not_a_step():
    assert find_steps(slow(series(seed=5, n=30), 15, 1.4)) == []


def test_two_stray_runs_side_by_side_in_the_middle_are_no_level():
    """Heavy tails: two runs that stray the same way together would be a level between two steps, and such a level
    needs MIN_LEVEL (4) runs; four such runs are a level."""
    flat = series(seed=5, n=40)
    assert find_steps(slow(slow(flat, 20, 1.25), 21, 1.25)) == []
    for i in range(20, 24):
        flat = slow(flat, i, 1.25)
    assert [(s.index, s.label) for s in find_steps(flat)] == [(20, Label.REGRESSION), (24, Label.IMPROVEMENT)]


def test_a_newest_run_no_further_out_than_an_earlier_stray_is_not_suspicious():
    """One slow newest run is suspicious on a quiet series, but not where an earlier run strayed further."""
    flat = series(seed=4, n=30)
    (step,) = find_steps(slow(flat, 29, 1.3))
    assert (step.index, step.label) == (29, Label.SUSPICIOUS)
    assert find_steps(slow(slow(flat, 10, 1.4), 29, 1.3)) == []


def ar1(seed: int, n: int, rho: float, sd: float = 0.03) -> list[Point]:
    """n runs of 1 ms whose log times are an AR(1) series (lag-1 correlation rho, sd `sd`), each with a 95% interval
    of +-0.02 (log scale)."""
    rng = np.random.default_rng(seed)
    logs = np.empty(n)
    logs[0] = rng.normal(0, sd)
    for i in range(1, n):
        logs[i] = rho * logs[i - 1] + math.sqrt(1 - rho**2) * rng.normal(0, sd)
    return [Point(*np.exp([y, y - 0.02, y + 0.02]).tolist()) for y in math.log(1e-3) + logs]


def test_runs_correlated_in_time_raise_few_false_alarms():
    """Slow phases of the machine (AR(1), 0.3 at lag 1) look like steps to a detector that takes runs to be
    independent (a level's standard error too small); the correlation is estimated within the levels and allowed
    for: 5 false steps in these 1,600 runs, where the detector before it raised 41 (16 before issue 81)."""
    runs = [ar1(seed, n=40, rho=0.3) for seed in range(40)]
    alarms = sum(len(find_steps(points)) for points in runs)
    assert alarms <= 24, alarms  # 1.5 per 100 runs


def test_the_inflation_is_the_variance_of_a_mean_of_correlated_runs():
    """_inflation(m, rho) (1 - rho): the variance of the mean of m AR(1) runs of unit variance over 1 / m."""
    for m, rho in [(1, 0.5), (2, 0.3), (10, 0.3), (40, 0.6)]:
        lags = np.abs(np.subtract.outer(np.arange(m), np.arange(m)))
        exact = (rho**lags).sum() / m**2
        assert steps_module._inflation(m, rho) * (1 - rho) == pytest.approx(exact * m)
    assert steps_module._inflation(25, 0.0) == 1.0


def mark(points: list[Point], index: int) -> list[Point]:
    """The series with a known change marked at `index`."""
    p = points[index]
    return [*points[:index], Point(p.typical_s, p.low_s, p.high_s, known_change=True), *points[index + 1 :]]


def test_no_alert_at_a_known_change_and_the_parts_on_either_side_are_fitted_apart():
    points = series(seed=6, n=30, at=15, ratio=1.25)
    assert [(s.index, s.label) for s in find_steps(points)] == [(15, Label.REGRESSION)]  # unmarked
    assert find_steps(mark(points, 15)) == []
    assert find_steps(mark(slow(points, 14, 1.3), 15)) == []  # one slow run before a mark: not the newest run
    later = series(seed=6, n=40, at=30, ratio=1.10)  # a step within the second part
    later = [Point(p.typical_s * 1.25, p.low_s * 1.25, p.high_s * 1.25) if i >= 20 else p for i, p in enumerate(later)]
    assert [(s.index, s.label) for s in find_steps(mark(later, 20))] == [(30, Label.REGRESSION)]


@pytest.mark.parametrize("n", [0, 1, 2, 3])
def test_a_series_too_short_says_insufficient_data(n):
    (step,) = find_steps(series(seed=7, n=n) if n else [])
    assert step.label == Label.INSUFFICIENT and math.isnan(step.ratio)


def test_too_few_runs_since_a_known_change_say_insufficient_data_after_the_steps_before_it():
    steps = find_steps(mark(series(seed=9, n=23, at=10, ratio=1.2), 20))
    assert [(s.index, s.label) for s in steps] == [(10, Label.REGRESSION), (20, Label.INSUFFICIENT)]


def test_a_threshold_above_the_step_drops_it_and_one_below_keeps_it():
    points = series(seed=1, at=10, ratio=1.10)
    assert find_steps(points, threshold=0.2) == []
    assert [s.index for s in find_steps(points, threshold=0.05)] == [10]


def test_a_threshold_below_what_the_noise_resolves_changes_nothing():
    for seed in range(20):
        points = series(seed, n=40, at=20, ratio=1.02, sd=0.05)
        assert find_steps(points, threshold=0.001) == find_steps(points)


def test_the_default_threshold_follows_the_series_noise():
    """A 3% step is resolved in a quiet series (0.5% between runs) and not in a noisy one (5%)."""
    assert [s.index for s in find_steps(series(seed=11, n=40, at=20, ratio=1.03, sd=0.005, half=0.01))] == [20]
    assert find_steps(series(seed=11, n=40, at=20, ratio=1.03, sd=0.05, half=0.01)) == []


def test_runs_without_an_interval_and_failed_runs_are_taken_as_they_come():
    points = [Point(p.typical_s, math.nan, math.nan) for p in series(seed=12, n=30, at=15, ratio=1.15)]
    points.insert(5, Point(math.nan, math.nan, math.nan))  # a failed run: left out, indices kept
    (step,) = find_steps(points)
    assert (step.index, step.label) == (16, Label.REGRESSION)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_series_longer_than_one_fit_is_fitted_in_windows_and_finds_its_steps(monkeypatch, seed):
    monkeypatch.setattr(partition, "LONGEST", 80)  # windows of 80 runs, 40 apart: 5 over 200 runs
    points = series(seed, n=200, at=130, ratio=1.08, sd=0.02)
    points = [*points[:60], *(slow(points, i, 0.93)[i] for i in range(60, 200))]  # 7% faster from run 60
    assert [(s.index, s.label) for s in find_steps(points)] == [(60, Label.IMPROVEMENT), (130, Label.REGRESSION)]


def test_steps_are_plain_values():
    step = find_steps(series(seed=1, at=10, ratio=1.10))[0]
    assert isinstance(step, Step) and str(step.label) == "regression"


# Issue 81: 12 sweeps of one case, two seeds a sweep, the work 10% more from the 7th sweep on, a load that came and
# went; typical times in microseconds, oldest first.
ISSUE_81_US = (
    *(69.0, 68.4, 74.3, 73.4, 72.9, 68.8, 67.7, 66.7, 66.7, 67.1, 69.4, 68.7),
    *(76.1, 77.9, 77.6, 78.8, 75.5, 75.9, 76.3, 76.9, 76.9, 75.1, 73.0, 74.0),
)


def sweeps(values_us, interval=apart_interval, seeds: int = 2) -> list[Point]:
    """Runs as `runner history` gives them to the detector: each with `interval`, the runs of a sweep one group."""
    return [Point(u * 1e-6, *interval(u * 1e-6), group=f"sweep{i // seeds}") for i, u in enumerate(values_us)]


def test_the_issue_81_sweeps_give_one_regression_at_the_7th_sweep():
    (step,) = find_steps(sweeps(ISSUE_81_US))
    assert (step.index, step.label) == (12, Label.REGRESSION)  # the 13th run: the 7th sweep's first
    assert step.p_value < 0.01
    assert step.low <= 76.2 / 69.4 <= step.high


@pytest.mark.parametrize("half", [0.05, 0.15, 0.20])
def test_intervals_wider_than_the_scatter_of_the_series_do_not_hide_the_issue_81_step(half):
    """Each run's interval +-5-20% (the within-run noise of that machine), while the sweeps scatter about 3%."""
    (step,) = find_steps(sweeps(ISSUE_81_US, lambda t: (t / (1 + half), t * (1 + half))))
    assert (step.index, step.label) == (12, Label.REGRESSION) and step.p_value < 0.01


def test_the_runs_of_a_sweep_are_one_point():
    """Three sweeps of four seeds are three points, too few to tell a step; six are enough, the step at its sweep's
    first run; the seeds of the sweep before a step cannot make a level of their own."""
    flat = [100.0 * math.exp(0.002 * k) for k in range(24)]
    (short,) = find_steps(sweeps(flat[:12], seeds=4))
    assert (short.index, short.label) == (0, Label.INSUFFICIENT)
    stepped = [v * (1.1 if i >= 12 else 1.0) for i, v in enumerate(flat)]
    assert [(s.index, s.label) for s in find_steps(sweeps(stepped, seeds=4))] == [(12, Label.REGRESSION)]
    (newest,) = find_steps(sweeps([*flat[:20], *(v * 1.3 for v in flat[20:])], seeds=4))
    assert (newest.index, newest.label) == (20, Label.SUSPICIOUS)  # one sweep after it, however many seeds


def test_a_quiet_series_resolves_a_step_its_wide_intervals_would_hide():
    """Runs scattering 0.5% between them, each with an interval of +-10%: a 3% step is resolved from the scatter the
    series shows, not the intervals."""
    (step,) = find_steps(series(seed=11, n=40, at=20, ratio=1.03, sd=0.005, half=0.10))
    assert (step.index, step.label) == (20, Label.REGRESSION)


def test_a_run_whose_interval_is_wider_than_the_others_weighs_less():
    """A newest run 30% slow is suspicious among runs that scatter 1%; where its own interval is as wide as that
    (+-40% against the others' +-2%), the series' scatter and its interval explain it: no step."""
    flat = slow(series(seed=4, n=30), 29, 1.3)
    assert [(s.index, s.label) for s in find_steps(flat)] == [(29, Label.SUSPICIOUS)]
    wide = Point(flat[29].typical_s, flat[29].typical_s / 1.4, flat[29].typical_s * 1.4)
    assert find_steps([*flat[:29], wide]) == []


def test_a_step_p_value_is_the_t_tail_at_one_place_and_below_bonferroni_over_many():
    """Hunter's chain over the places searched: at one place the two-sided Student t tail; over many, between the
    tail at one place and Bonferroni's bound (the tail times the places), about half of it where the places' tests
    are alike (40 equal points, 3 standard errors: 0.093 against 0.199)."""
    from scipy.stats import t as student

    one = steps_module._p_value(3.0, 10, np.array([0.5]))
    assert one == pytest.approx(2 * student.sf(3.0, 10))
    places = steps_module._places(np.ones(40), newest=False)
    p = steps_module._p_value(3.0, 30, places)
    tail = 2 * student.sf(3.0, 30)
    assert tail < p < len(places) * tail / 1.5, (tail, p, len(places))

"""The statistics the comparisons and the history share (runner.report.statistics), each against a value worked out by
hand or a table's."""

from __future__ import annotations

import math

import numpy as np
import pytest

from runner.report.statistics import either_side, pulled_in, student_p_value, student_quantile, weighted_median


def test_student_quantile_and_p_value_are_the_tables_and_each_others_inverse():
    assert student_quantile(math.inf, 0.975) == pytest.approx(1.959964, abs=1e-6)  # the normal's
    assert student_quantile(10, 0.975) == pytest.approx(2.228139, abs=1e-6)
    assert student_p_value(student_quantile(10, 0.975), 10) == pytest.approx(0.05)
    assert student_p_value(-2.228139, 10) == pytest.approx(0.05, abs=1e-6)  # two-sided: the sign is no matter


def test_the_weighted_median_is_where_half_the_weight_is_reached_one_per_row_of_weights():
    values = np.array([3.0, 1.0, 2.0])
    assert weighted_median(values, np.ones(3)) == 2.0
    assert weighted_median(values, np.array([5.0, 1.0, 1.0])) == 3.0  # the heavy value wins
    rows = np.array([[0.0, 1.0, 1.0], [1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])  # the first two, all three, the first alone
    assert weighted_median(values, rows).tolist() == [1.0, 2.0, 3.0]


def test_an_outlying_value_is_pulled_in_to_its_bound_and_the_others_stay():
    assert pulled_in(np.array([0.5, 10.0, -7.0]), 0.0, 1.0).tolist() == [0.5, 3.0, -3.0]
    each_its_own = pulled_in(np.array([1.0, 2.0]), np.array([0.0, 0.0]), np.array([0.1, 1.0]))  # a centre and sd each
    assert each_its_own.tolist() == pytest.approx([0.3, 2.0])


def test_the_levels_either_side_of_a_change_run_from_the_change_before_to_the_one_after():
    assert either_side([2, 5, 8], 5, 10) == (slice(2, 5), slice(5, 8))
    assert either_side([2, 5, 8], 2, 10) == (slice(0, 2), slice(2, 5))  # the first: from the series' start
    assert either_side([2, 5, 8], 8, 10) == (slice(5, 8), slice(8, 10))  # the last: to its end

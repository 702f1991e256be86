"""benchmarks/rounds.py writes its BENCHMARKS.md section from what it measured (the measuring itself,
24 TensorFlow sweeps under a burner, is run by hand: `python benchmarks/rounds.py`)."""

from __future__ import annotations

import math
import sys

import pandas as pd
import pytest

from runner.config import PROJECT_ROOT
from runner.report.ratio import PROCESS_SD, half_width

sys.path.insert(0, str(PROJECT_ROOT / "benchmarks"))
import rounds as bench  # noqa: E402


def _frame(interleaved_ratios, intervals, budget_s=bench.ISSUE_BUDGET_S):
    rows = []
    for i, (order, ratio) in enumerate(zip(bench.ORDERS * 2, [3.4, 2.7, 3.3, 2.9], strict=True)):
        rows.append({"budget_s": budget_s, "repeat": i // 2 + 1, "order": order, "rounds": 1, "ratio": ratio})
        rows[-1].update(low=float("nan"), high=float("nan"), se=float("nan"), wall_s=20.0, other_runnable=1.0)
    for i, (ratio, (low, high)) in enumerate(zip(interleaved_ratios, intervals, strict=True)):
        rows.append({"budget_s": budget_s, "repeat": i // 2 + 1, "order": bench.ORDERS[i % 2], "rounds": 5})
        se = bench.standard_error(low, high, 5)
        rows[-1].update(ratio=ratio, low=low, high=high, se=se, wall_s=21.0, other_runnable=1.0)
    return pd.DataFrame(rows)


def test_the_section_states_the_spread_both_ways_and_the_verdict():
    frame = _frame([3.0, 3.1, 3.05, 3.02], [(2.8, 3.2), (2.9, 3.3), (2.85, 3.25), (2.9, 3.1)])
    text = bench.section(frame, 5, (1.0, 2.0), (1.1, 1.2))
    assert text.startswith(bench.BEGIN) and text.endswith(bench.END)
    assert "one job after the other: **1.259**; 5 rounds: **1.033**" in text
    assert "overlap: yes) | <= 1.10 with rounds, and the intervals of the repeats overlap | meets target |" in text
    assert "| wall time of a sweep, rounds / one after the other, `max_time_s=3` | 1.05 (21.0 s vs 20.0 s)" in text
    assert text.count("\n| 3 s | 1 | eager,function |") == 2  # one row per sweep
    assert "p90/p10 without the burner, before and after: 1.10, 1.20" in text


def test_intervals_that_do_not_overlap_miss_the_target():
    frame = _frame([3.0, 3.1, 3.05, 3.02], [(2.8, 2.9), (3.0, 3.3), (2.85, 3.25), (2.9, 3.1)])
    assert "overlap: no) | <= 1.10 with rounds, and the intervals of the repeats overlap | MISSES target |" in (
        bench.section(frame, 5, (1.0, 2.0), (1.0, 1.0))
    )


def test_the_intervals_predict_the_spread_their_standard_errors_imply():
    """Six sweeps whose standard error is 0.02: over six repeats, a max/min near exp(2.53 x 0.02). 40 rounds are
    8 batches of 5 (t with 7 degrees of freedom for the rounds' part), beside each process's spread: the
    standard error read back from an interval is the rounds' and the processes' together."""
    half = half_width(0.015, 7, 0.95, PROCESS_SD)
    se = bench.standard_error(math.exp(-half), math.exp(half), 40)
    assert se == pytest.approx(math.sqrt(0.015**2 + 2 * PROCESS_SD**2), rel=1e-6)
    assert bench.standard_error(1.0, 1.0, 40) == pytest.approx(math.sqrt(2) * PROCESS_SD)  # no narrower than that
    frame = pd.DataFrame({"se": [0.02] * 6})
    assert bench.predicted_spread(frame) == pytest.approx(math.exp(2.534 * 0.02), rel=1e-3)


def test_the_section_replaces_its_old_self_and_nothing_else():
    old = f"# Benchmarks\n\nrows\n\n{bench.BEGIN}\nold\n{bench.END}\n\n<!-- parity:begin -->\nkept\n"
    new = bench.replace_section(old, f"{bench.BEGIN}\nnew\n{bench.END}")
    assert "old" not in new and "new" in new and "kept" in new and new.startswith("# Benchmarks")


def test_each_section_a_benchmark_rewrites_holds_its_own_heading_only():
    """A benchmark's --write replaces what lies between its markers in BENCHMARKS.md: a section written by hand
    inside them (the node-block, GPU and generation sections once sat inside history_sim.py's) is lost by the next."""
    import re

    text = (PROJECT_ROOT / "BENCHMARKS.md").read_text()
    for block in re.finditer(r"<!-- ([\w-]+):begin -->(.*?)<!-- \1:end -->", text, re.S):
        headings = re.findall(r"^## .*", block.group(2), re.M)
        assert len(headings) <= 1, f"{block.group(1)}'s markers hold {headings}"

"""benchmarks/rounds.py writes its BENCHMARKS.md section from what it measured (the measuring itself,
eight TensorFlow sweeps under a burner, is run by hand: `python benchmarks/rounds.py`)."""

from __future__ import annotations

import sys

import pandas as pd

from runner.config import PROJECT_ROOT

sys.path.insert(0, str(PROJECT_ROOT / "benchmarks"))
import rounds as bench  # noqa: E402


def _frame(interleaved_ratios, intervals):
    rows = []
    for i, (order, ratio) in enumerate(zip(bench.ORDERS * 2, [3.4, 2.7, 3.3, 2.9], strict=True)):
        rows.append({"repeat": i // 2 + 1, "order": order, "rounds": 1, "ratio": ratio, "low": float("nan")})
        rows[-1].update(high=float("nan"), wall_s=20.0, other_runnable=1.0)
    for i, (ratio, (low, high)) in enumerate(zip(interleaved_ratios, intervals, strict=True)):
        rows.append({"repeat": i // 2 + 1, "order": bench.ORDERS[i % 2], "rounds": 5, "ratio": ratio, "low": low})
        rows[-1].update(high=high, wall_s=21.0, other_runnable=1.0)
    return pd.DataFrame(rows)


def test_the_section_states_the_spread_both_ways_and_the_verdict():
    frame = _frame([3.0, 3.1, 3.05, 3.02], [(2.8, 3.2), (2.9, 3.3), (2.85, 3.25), (2.9, 3.1)])
    text = bench.section(frame, 5, (1.0, 2.0))
    assert text.startswith(bench.BEGIN) and text.endswith(bench.END)
    assert "one job after the other: **1.26**; 5 rounds: **1.03**" in text
    assert "meets target (intervals overlap: yes)" in text
    assert "| wall time of a sweep, rounds / one after the other | 1.05 (21.0 s vs 20.0 s)" in text
    assert text.count("\n| 1 | eager,function |") == 2  # one row per sweep


def test_intervals_that_do_not_overlap_miss_the_target():
    frame = _frame([3.0, 3.1, 3.05, 3.02], [(2.8, 2.9), (3.0, 3.3), (2.85, 3.25), (2.9, 3.1)])
    assert "MISSES target (intervals overlap: no)" in bench.section(frame, 5, (1.0, 2.0))


def test_the_section_replaces_its_old_self_and_nothing_else():
    old = f"# Benchmarks\n\nrows\n\n{bench.BEGIN}\nold\n{bench.END}\n\n<!-- parity:begin -->\nkept\n"
    new = bench.replace_section(old, f"{bench.BEGIN}\nnew\n{bench.END}")
    assert "old" not in new and "new" in new and "kept" in new and new.startswith("# Benchmarks")

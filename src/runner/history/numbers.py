"""Numbers over time: each run's error against its float64 reference and the tokens that differ from the reference's,
as series fitted by the same detector as the times (runner.history.steps); a step there is a NUMERIC change."""

from __future__ import annotations

import math
from dataclasses import replace

from runner.history.series import NUMBERS, Entry, History, medians_either_side
from runner.history.steps import Label, Step, find_steps

# The least factor by which a metric must move to be a numeric change: the error of another, equally careful order
# of the same sums (a new kernel, another blocking) moves by less, and a gate that fails on that gets switched off.
# Every change of the tokens counts (a count fitted plus one: 0 -> 1 is 2x, 3 -> 4 is 1.25x).
MATERIAL = {"max_rel_err_vs_reference": 2.0, "tokens_differ": 1.0}


def numeric_steps(entries: list[Entry]) -> dict[str, list[Step]]:
    """Per metric of NUMBERS that some of `entries` recorded, the steps of its series that move it by its MATERIAL
    factor or more, each a NUMERIC change (a part too short to tell is left to the times' series to say)."""
    found = {}
    for name in NUMBERS:
        if any(name in e.numbers for e in entries):
            steps = find_steps([e.number_point(name) for e in entries])
            found[name] = [replace(s, label=Label.NUMERIC) for s in steps if _material(s, MATERIAL[name])]
    return found


def _material(step: Step, factor: float) -> bool:
    return step.label != Label.INSUFFICIENT and max(step.ratio, 1 / step.ratio) >= factor


def recorded_numbers(metrics: dict[str, float]) -> dict[str, float]:
    """A run's NUMBERS from its metrics. MLflow keeps no error of an exact result (runner.tracking.run_page: no
    logarithm of 0), so a run compared with its reference (`within_reference_tolerance`) without one had none."""
    found = {name: float(metrics[name]) for name in NUMBERS if name in metrics}
    if "within_reference_tolerance" in metrics:
        found.setdefault("max_rel_err_vs_reference", 0.0)
    return found


def versions_said(before: str, after: str) -> str:
    if before == after:
        return f"{after}, either side" if after else ""
    return f"{before or '?'} → {after or '?'}"


def number_levels(history: History, name: str, step: Step) -> tuple[float, float]:
    """The median of the metric `name` over the runs of the level before `step` and of the level after it (each
    from the metric's step before, or the first run, to its next step, or the newest run)."""
    steps = history.numbers.get(name, [])
    return medians_either_side(history.entries, steps, step, lambda e: e.numbers.get(name, math.nan))


def format_number(name: str, value: float) -> str:
    """A count of tokens as a whole number where it is one, an error to 2 figures ('0' where exact)."""
    if name == "tokens_differ" and float(value).is_integer():
        return f"{value:.0f}"
    return f"{value:.2g}"

"""A store's steps held to a false-discovery rate together (runner history --fdr): each step's p-value (the
detector's own test, runner.history.steps) adjusted by Benjamini-Hochberg over every series but the controls, and what
that says of the steps kept. runner.history.build's docstring says why."""

from __future__ import annotations

import math
from dataclasses import replace

from runner.history.series import History
from runner.history.steps import MIN_POINTS, Step

DEFAULT_FDR = 0.05  # runner history --fdr: the false-discovery rate a store's steps are held to


def control_fdr(histories: list[History], rate: float) -> None:
    """Hold the steps of `histories` (their controls aside) to the false-discovery rate `rate`, the steps in times
    and those in numbers apart: each step gets its Benjamini-Hochberg q-value, and is significant where that is at
    most `rate` (see the module's docstring)."""
    timed = [h for h in histories if not h.is_control]
    for h, steps in zip(timed, _adjusted([_tested(h.steps, len(h.entries)) for h in timed], rate), strict=True):
        h.steps = steps
    series = [(h, name) for h in timed for name in h.numbers]
    groups = [_tested(h.numbers[name], sum(name in e.numbers for e in h.entries)) for h, name in series]
    for (h, name), steps in zip(series, _adjusted(groups, rate), strict=True):
        h.numbers[name] = steps


def _tested(steps: list[Step], runs: int) -> tuple[list[Step], bool]:
    """A series' steps, and whether the series was tested at all (MIN_POINTS runs or more)."""
    return steps, runs >= MIN_POINTS


def _adjusted(groups: list[tuple[list[Step], bool]], rate: float) -> list[list[Step]]:
    """Each group's steps with their BH q-values (those with a p-value), over every step with one; a group tested
    with none of them counts as one hypothesis at p = 1."""
    from scipy.stats import false_discovery_control

    p_values = [s.p_value for steps, _ in groups for s in steps if math.isfinite(s.p_value)]
    quiet = sum(tested and not any(math.isfinite(s.p_value) for s in steps) for steps, tested in groups)
    if not p_values:
        return [steps for steps, _ in groups]
    q_values = iter(false_discovery_control([*p_values, *[1.0] * quiet], method="bh")[: len(p_values)].tolist())
    return [[_held(s, next(q_values), rate) if math.isfinite(s.p_value) else s for s in steps] for steps, _ in groups]


def _held(step: Step, q_value: float, rate: float) -> Step:
    return replace(step, q_value=q_value, significant=q_value <= rate)


def fdr_summary(histories: list[History], fdr: float) -> str:
    """'42 series (a case on a machine): 3 steps significant at a false-discovery rate of 5% ...': what
    Benjamini-Hochberg says of the steps kept, the expected number of false ones among them; then the steps of the
    figures (runner.history.figures), which the rate does not hold, counted apart."""
    series = [h for h in histories if not h.is_control]
    tested = [s for h in series for s in [*h.steps, *_numeric(h)] if math.isfinite(s.q_value)]
    kept = sum(s.significant for s in tested)
    dropped = len(tested) - kept
    head = f"{len(series)} series (a case on a machine): "
    if not kept:
        head += f"no step significant at a false-discovery rate of {fdr:.0%}"
    else:
        head += (
            f"{kept} step{'s' if kept != 1 else ''} significant at a false-discovery rate of {fdr:.0%} "
            f"(Benjamini-Hochberg): on average at most {fdr:.0%} of steps so kept are false, "
            f"about {fdr * kept:.2g} of these {kept}"
        )
    tail = f"; {dropped} more found by a series alone, not significant across the store" if dropped else ""
    figures = sum(len(steps) for h in series for steps in h.figures.values())
    aside = (
        f"; {figures} step{'s' if figures != 1 else ''} of a figure (first call, load, memory, ...), each held to its "
        "figure's factor, not to this rate"
    )
    return head + tail + (aside if figures else "")


def _numeric(history: History) -> list[Step]:
    return [s for steps in history.numbers.values() for s in steps]

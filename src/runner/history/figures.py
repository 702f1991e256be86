"""The other figures a run records that a CI job gates on, each a series of its own beside the typical time: the first
call (tracing and compilation with it), load, peak memory and energy, and the figures a task marks watched (a
generation's first token, per-token time and tokens/s). A compiler regression that doubles compilation and leaves the
steady state alone moved only the first call, and no gate saw it. Each series is fitted by the same detector as the
times (runner.history.steps), its noise from its own scatter, a step labelled by the figure's direction and kept where
it moves the figure by its material factor or more (and a one-shot time, by ONE_SHOT_LEAST_S too)."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from runner.backends import first_call
from runner.history.series import Entry, medians_either_side
from runner.history.steps import Label, Point, Step, find_steps
from runner.record.table import format_seconds
from runner.tasks import builtin_metrics


@dataclass(frozen=True)
class Figure:
    said: str  # as a line names it
    higher_is_better: bool
    material: float  # the least factor that is a change: PyTorch's dashboard gates compilation latency at 1.15x
    least: float = 0.0  # the least change in its own unit that is one too (ONE_SHOT_LEAST_S for a one-shot time)
    load_moves: bool = True  # what else ran moves it (a time, energy): a step beside busy runs may be load's alone


# A first call, its parts and the load are each timed once a run: one sample, which a busy machine's scheduler can
# preempt for a slice or more. On 2 cores at load 13, numpy chain's 0.45 ms first call took 3.9 and 2.9 ms on two
# nights in a row, a 7x "regression" that failed the nightly gate (BENCHMARKS.md, the history gate's A/A nights per
# series); a change that small is no compiler's either. A step in them counts only where it also moves them by this.
ONE_SHOT_LEAST_S = 0.02
ONE_SHOT = {"first_call_s", "load_s", *first_call.PARTS_S, first_call.EXECUTE_S}


# the runner's own figures of every run; a task's own are its metrics marked `watched` (runner.tasks.Metric)
RUN_FIGURES = {
    "first_call_s": Figure("first call", False, 1.15, ONE_SHOT_LEAST_S),
    "load_s": Figure("load", False, 1.15, ONE_SHOT_LEAST_S),
    "peak_host_mb": Figure("peak host memory", False, 1.10, load_moves=False),
    "peak_device_mb": Figure("peak device memory", False, 1.10, load_moves=False),
    "energy_per_call_j": Figure("energy per call", False, 1.10),
}
FIGURES = RUN_FIGURES | {
    m.key: Figure(m.heading, m.higher_is_better, m.watched, ONE_SHOT_LEAST_S if m.key in ONE_SHOT else 0.0)
    for m in builtin_metrics()
    if m.watched is not None
}


def recorded_figures(metrics: dict[str, float]) -> dict[str, float]:
    """A run's FIGURES from its metrics, where it recorded them (finite and above zero: a log scale)."""
    return {name: float(metrics[name]) for name in FIGURES if name in metrics and float(metrics[name]) > 0}


def figure_steps(entries: list[Entry]) -> dict[str, list[Step]]:
    """Per figure that some of `entries` recorded, the steps of its series that move it by its material factor or more,
    labelled by its direction (a step up in tokens/s is an improvement)."""
    found = {}
    for name, figure in FIGURES.items():
        if any(name in e.figures for e in entries):
            points = [
                Point(e.figures.get(name, math.nan), math.nan, math.nan, bool(e.change), e.sweep) for e in entries
            ]
            steps = [s for s in find_steps(points) if _material(s, figure)]
            found[name] = [_directed(s, figure) for s in steps]
    return found


def _material(step: Step, figure: Figure) -> bool:
    """A step of the figure's material factor or more, and of its least change (from the level before it) or more."""
    if step.label == Label.INSUFFICIENT or max(step.ratio, 1 / step.ratio) < figure.material:
        return False
    return not figure.least or not step.before * abs(step.ratio - 1) < figure.least


def _directed(step: Step, figure: Figure) -> Step:
    if not figure.higher_is_better or step.label not in (Label.REGRESSION, Label.IMPROVEMENT):
        return step
    return replace(step, label=Label.IMPROVEMENT if step.label == Label.REGRESSION else Label.REGRESSION)


def levels(entries: list[Entry], steps: list[Step], name: str, step: Step) -> tuple[float, float]:
    """The figure's median over the runs of the level before `step` and of the level after it, among the figure's
    `steps` (series.medians_either_side)."""
    return medians_either_side(entries, steps, step, lambda e: e.figures.get(name, math.nan))


def format_figure(name: str, value: float) -> str:
    if name.endswith("_s"):
        return format_seconds(value)
    unit = {"peak_host_mb": " MB", "peak_device_mb": " MB", "energy_per_call_j": " J"}.get(name, "")
    return f"{value:.3g}{unit}"

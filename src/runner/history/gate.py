"""`runner history --fail-on LABELS`: the gate a CI job runs on the histories. Which steps fail it (their labels, their
significance across the store, a control's aside; with --new-within N only those among each series' newest N runs),
which cases (their newest runs failed, or they stopped appearing), and with --confirm, each flagged case run again
first (runner.history.confirm), the gate failing only where its step stands. The command prints what it returns."""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TextIO

from runner.history.describe import describe_figure, describe_number, describe_step
from runner.history.gaps import GATED, Gapped
from runner.history.series import History
from runner.history.steps import Label, Step


@dataclass(frozen=True)
class Judged:
    """The gate's exit status (1: it fails) and its lines for stderr: each failing step or case, and each flagged step
    a re-run cleared."""

    status: int
    lines: list[str]


def judged(
    uri: str,
    gated: list[History],
    gapped: list[Gapped],
    labels: set[str],
    confirm: bool,
    confirmed: Judged | None = None,
) -> Judged:
    """--fail-on's verdict on the `gated` histories (as recent gives them) and the `gapped` cases; with `confirm`,
    the steps in times judged by their re-runs (`confirmed`, where they were made already: its lines are said), those
    of the numbers and figures as they stand."""
    gaps = [f"failing: {g.line()}" for g in gapped if str(g.gap) in labels]
    if not confirm:
        failing_lines = [f"failing: {line}" for line in failing(gated, labels)]
        return Judged(int(bool(gaps or failing_lines)), gaps + failing_lines)
    rerun = confirmed or confirmed_steps(uri, gated, labels)
    numeric = [f"failing: {line}" for line in failing_numbers(gated, labels) + failing_figures(gated, labels)]
    lines = gaps + ([] if confirmed else rerun.lines) + numeric
    return Judged(max(rerun.status, int(bool(gaps or numeric))), lines)


def confirmed_steps(uri: str, gated: list[History], labels: set[str], out: TextIO = sys.stderr) -> Judged:
    """--confirm: each flagged case run again (runner.history.confirm, its progress on `out`), each flagged step said
    with its re-run's word; the status 1 only where a step stands. The flagged histories' newest runs carry the word."""
    from runner.history.confirm import confirm

    flagged = failing_steps(gated, labels)
    said = confirm(uri, flagged, out)
    steps = [(h, s) for h, found in flagged for s in found]
    lines = [
        f"{'failing' if c.stands else 'flagged'}: {h.case_name}: {describe_step(h, step)}; {c.line()}"
        for (h, step), c in zip(steps, said, strict=True)
    ]
    return Judged(int(any(c.stands for c in said)), lines)


def failing(histories: list[History], labels: set[str]) -> list[str]:
    """The steps whose label is one of `labels` (runner history --fail-on), as printed: the times' (failing_steps),
    then the numbers' (failing_numbers)."""
    times = [f"{h.case_name}: {describe_step(h, s)}" for h, steps in failing_steps(histories, labels) for s in steps]
    return times + failing_numbers(histories, labels) + failing_figures(histories, labels)


def failing_figures(histories: list[History], labels: set[str]) -> list[str]:
    """The steps of the figures (the first call and its parts, load, memory, a generation's: runner.history.figures)
    whose label is one of `labels`, as printed; a control's aside. No re-run judges them (--confirm re-runs for the
    times): a figure's step fails the gate as it stands."""
    return _failing_in(histories, lambda h: h.figures, describe_figure, lambda step: str(step.label) in labels)


def failing_steps(histories: list[History], labels: set[str]) -> list[tuple[History, list[Step]]]:
    """Per history, its steps in time whose label is one of `labels` and that are significant across the store; a
    control's own series aside (its steps are the whole machine's, which the series fitted relative to it have
    cancelled)."""
    found = [(h, [s for s in h.steps if str(s.label) in labels and s.significant]) for h in histories]
    return [(h, steps) for h, steps in found if steps and not h.is_control]


def recent(histories: list[History], newest: int | None) -> list[History]:
    """The histories as a nightly gate judges them (runner history --new-within N): only the steps, in times and in
    numbers, that start among each series' newest `newest` runs, what the latest runs changed; an older step stays in
    the history and its pages, and fails no gate again. None: every step."""
    if newest is None:
        return histories

    def new(h: History, steps: list[Step]) -> list[Step]:
        return [s for s in steps if len(h.entries) - s.index <= newest]

    return [
        replace(
            h,
            steps=new(h, h.steps),
            numbers={name: new(h, steps) for name, steps in h.numbers.items()},
            figures={name: new(h, steps) for name, steps in h.figures.items()},
        )
        for h in histories
    ]


def failing_numbers(histories: list[History], labels: set[str]) -> list[str]:
    """The changes of numbers (NUMERIC), as printed, where `labels` holds theirs: a control's aside, as its times."""
    if str(Label.NUMERIC) not in labels:
        return []
    return _failing_in(histories, lambda h: h.numbers, describe_number, lambda step: True)


def _failing_in(
    histories: list[History],
    series: Callable[[History], dict[str, list[Step]]],
    described: Callable[[History, str, Step], str],
    wanted: Callable[[Step], bool],
) -> list[str]:
    """The significant steps of each history's `series` (its numbers or its figures) that `wanted` keeps, as printed;
    a control's aside."""
    return [
        f"{h.case_name}: {described(h, name, s)}"
        for h in histories
        if not h.is_control
        for name, steps in series(h).items()
        for s in steps
        if s.significant and wanted(s)
    ]


def fail_labels(text: str) -> set[str]:
    """--fail-on's labels ('regression,suspicious'), each checked against the labels a step can have; a label of two
    words may be given by its first ('numeric': 'numeric change')."""
    given = {label.strip() for label in text.split(",") if label.strip()}
    labels = [*map(str, Label), *map(str, GATED)]  # a step's, or a case's newest data: failing, missing (not stopped)
    known = {label: label for label in labels} | {label.split()[0]: label for label in labels}
    if given - known.keys():
        allowed = ", ".join(sorted(labels))
        raise LookupError(f"--fail-on {text}: {', '.join(sorted(given - known.keys()))} is no label ({allowed})")
    return {known[label] for label in given}

"""`runner history --markdown`: the histories as a pull request's comment, in GitHub-flavoured markdown.

A headline with the verdict (the gate's, where --fail-on names labels), what the false-discovery rate says of the steps
kept (history.fdr_summary), each sweep whose control gave no time (describe.control_notes), a table of the cases with a
step, those that alert first (case, machine, its typical time now, with the newest run's host where the case's runs ran
on several; the step: a ratio with its interval, the numbers either side, or a figure's name, ratio and levels either
side; its label, and the re-run's word and its q-value), then the quiet cases (no step, or too few runs to tell) in a
collapsed <details>. Every name is escaped: a pipe in a case's name cannot split a cell, nor a `<` open a tag.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from runner.history.describe import control_notes
from runner.history.fdr import fdr_summary
from runner.history.figures import FIGURES, format_figure
from runner.history.figures import levels as figure_levels
from runner.history.gate import recent
from runner.history.numbers import format_number, number_levels
from runner.history.series import NUMBERS, History
from runner.history.steps import Label, Step
from runner.record.table import format_interval, format_ratio, format_seconds

ALERTS = {str(Label.REGRESSION), str(Label.SUSPICIOUS), str(Label.NUMERIC)}  # without --fail-on: what alerts
COLUMNS = ("case", "machine", "now", "step", "label", "confirmed / q")
SPECIAL = re.compile(r"([\\`*_{}\[\]<>|~&#!])")  # markdown's own punctuation, each escaped with a backslash


@dataclass(frozen=True)
class Row:
    history: History
    step: Step
    metric: str = ""  # one of NUMBERS or figures.FIGURES where the step is in those; '' : in the times
    alert: bool = False


def comment(
    histories: list[History], fdr: float | None, labels: set[str], confirm: bool = False, within: int | None = None
) -> str:
    """The comment: headline, the false-discovery line, the table of cases with a step, the quiet cases. `labels`:
    --fail-on's (none: the ALERTS labels alert, and there is no gate); `confirm`: the gate fails only on the steps
    in time that a re-run confirmed (the newest run's history.confirmed tag), as runner history --confirm does;
    `within`: --new-within's N, a step older than that alerts no more (history.recent), as it fails no gate."""
    new = {(h.case, h.machine, name, s.index) for h in recent(histories, within) for name, s in _steps(h)}
    rows = _rows(histories, labels or ALERTS, new)
    quiet = [h for h in histories if not any(r.history is h for r in rows)]
    out = [_headline(rows, histories, labels, confirm, within), ""]
    out += [fdr_summary(histories, fdr), ""] if fdr is not None else []
    notes = [f"- {cell(h.case_name)}: {cell(note)}" for h in histories for note in control_notes(h)]
    out += [*notes, ""] if notes else []
    out += _table(rows) if rows else ["No step in any case."]
    return "\n".join(out + _quiet(quiet))


def cell(text: str) -> str:
    """Text as one table cell: markdown's punctuation escaped (a pipe ends no cell), on one line."""
    return SPECIAL.sub(r"\\\1", " ".join(str(text).split()))


def _steps(h: History) -> list[tuple[str, Step]]:
    """Its steps in time (''), in each of its numbers and in each of its figures (the metric's name)."""
    others = [(name, s) for series in (h.numbers, h.figures) for name, steps in series.items() for s in steps]
    return [("", s) for s in h.steps] + others


def _rows(histories: list[History], labels: set[str], new: set[tuple[str, str, str, int]]) -> list[Row]:
    """Every step that alerts (significant, its label among `labels`, not a control's, among the `new` ones), then
    for each case without one, its newest step in time and in each of its numbers."""
    alerts, others = [], []
    for h in histories:
        found = [(s, name) for name, s in _steps(h) if s.label != Label.INSUFFICIENT]
        raised = [
            Row(h, s, name, True)
            for s, name in found
            if _alerts(h, s, labels) and (h.case, h.machine, name, s.index) in new
        ]
        alerts += raised
        if not raised:
            newest = {name: s for s, name in sorted(found, key=lambda item: item[0].index)}
            others += [Row(h, s, name) for name, s in newest.items()]
    return alerts + others


def _alerts(history: History, step: Step, labels: set[str]) -> bool:
    return step.significant and str(step.label) in labels and not history.is_control


def _failing(row: Row, labels: set[str], confirm: bool) -> bool:
    if not (labels and row.alert):
        return False
    return not confirm or bool(row.metric) or row.history.entries[-1].confirmed.startswith("yes")


def _headline(rows: list[Row], histories: list[History], labels: set[str], confirm: bool, within: int | None) -> str:
    alerts = sum(r.alert for r in rows)
    cases = sum(not h.is_control for h in histories)  # as the false-discovery line counts them: controls aside
    found = f"{alerts} alert{'s' if alerts != 1 else ''} in {cases} series"
    if not labels:
        return f"### runner history: {found}"
    given = ",".join(sorted(label.split()[0] for label in labels))  # as fail_labels takes them: 'numeric'
    gate = f"`--fail-on {given}{f' --new-within {within}' if within else ''}{' --confirm' if confirm else ''}`"
    failing = any(_failing(r, labels, confirm) for r in rows)
    return f"### runner history: {'❌ fails' if failing else '✅ passes'} {gate}: {found}"


def _table(rows: list[Row]) -> list[str]:
    out = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    return out + ["| " + " | ".join(cell(c) for c in _cells(r)) + " |" for r in rows]


def _cells(row: Row) -> list[str]:
    h, step = row.history, row.step
    name = f"{h.case_name} (control)" if h.is_control else h.case_name
    label = str(step.label) if step.significant else f"{step.label}, not significant across the store"
    return [name, h.machine_name, _now(h), _step(row), label, _word(row)]


def _now(h: History) -> str:
    """Its newest run's typical time, with that run's host where the case's runs ran on several: '110 µs on ci-2'."""
    newest = h.entries[-1]
    return format_seconds(newest.typical_s) + (f" on {newest.host}" if h.several_hosts() and newest.host else "")


def _step(row: Row) -> str:
    """'1.10x [1.06–1.14]', 'max rel err vs float64 2.1e-07 → 8.4e-07', or a figure's 'first call 1.43x [1.37–1.50]:
    702 ms → 1 s'."""
    if row.metric in NUMBERS:
        before, after = number_levels(row.history, row.metric, row.step)
        return f"{NUMBERS[row.metric]} {format_number(row.metric, before)} → {format_number(row.metric, after)}"
    interval = format_interval((row.step.low, row.step.high))
    ratio = f"{format_ratio(row.step.ratio)}{f' [{interval[:-1]}]' if interval else ''}"
    if not row.metric:
        return ratio
    h, name = row.history, row.metric
    before, after = figure_levels(h.entries, h.figures.get(name, []), name, row.step)
    return f"{FIGURES[name].said} {ratio}: {format_figure(name, before)} → {format_figure(name, after)}"


def _word(row: Row) -> str:
    """The re-run's word on an alert in time (where runner history --confirm re-ran it), then the q-value."""
    said = row.history.entries[-1].confirmed.split(":")[0] if row.alert and not row.metric else ""
    confirmed = {"yes": "confirmed", "no": "not confirmed"}.get(said, "")
    q = f"q {row.step.q_value:.2g}" if math.isfinite(row.step.q_value) else ""
    return ", ".join(part for part in (confirmed, q) if part) or "-"


def _quiet(histories: list[History]) -> list[str]:
    if not histories:
        return []
    out = ["", f"<details><summary>{len(histories)} quiet series (no step found)</summary>", ""]
    out += ["| case | machine | now | runs |", "|---|---|---|---|"]
    for h in histories:
        out.append(f"| {cell(h.case_name)} | {cell(h.machine_name)} | {cell(_now(h))} | {len(h.entries)} |")
    return out + ["", "</details>"]

"""What `runner history` says of a history: each step, each change of its numbers and figures, in words; the
terminal's lines; the verdict on its newest run."""

from __future__ import annotations

import math
from datetime import UTC, datetime
from pathlib import Path

from runner.history.fdr import fdr_summary
from runner.history.figures import FIGURES, format_figure
from runner.history.figures import levels as figure_levels
from runner.history.narrow import TIMES, series_names, times_read
from runner.history.numbers import format_number, number_levels, versions_said
from runner.history.series import NUMBERS, Entry, History
from runner.history.steps import MIN_POINTS, Label, Step
from runner.record.table import format_interval, format_ratio, format_seconds


def describe_step(history: History, step: Step) -> str:
    """'regression: 1.10x [1.06–1.14] from run 3f2a… (2026-11-26 14:02, torch 2.14.1 @ 0f5a11b)' ('1.10x
    [1.06–1.14] relative to its control' where the series was fitted so: a gate's or a sweep's line stands alone), or
    'insufficient data: 2 runs since 2026-11-26 14:02, 4 tell a step' ('6 runs in 3 sweeps since ..., 4 sweeps tell a
    step'); a step above the store's false-discovery rate says so after its label ('regression, not significant
    across the store (q 0.31): ...')."""
    first = history.entries[step.index]
    when = _when(first)
    if step.label == Label.INSUFFICIENT:
        since = history.entries[step.index :]
        runs, points = len(since), len({e.sweep or e.run_id for e in since})
        if points < runs:  # the runs of a sweep are one point
            sweeps = f"{points} sweep{'s' if points != 1 else ''}"
            return f"{step.label}: {runs} runs in {sweeps} since {when}, {MIN_POINTS} sweeps tell a step"
        return f"{step.label}: {runs} run{'s' if runs != 1 else ''} since {when}, {MIN_POINTS} tell a step"
    interval = format_interval((step.low, step.high))
    where = f"run {run_said(first.run_id)} ({when}{', ' + first.version if first.version else ''})"
    relative = " relative to its control" if history.relative and any(s is step for s in history.steps) else ""
    ratio = f"{format_ratio(step.ratio)}{f' [{interval[:-1]}]' if interval else ''}{relative}"
    said = f"{_label(step)}: {ratio} from {where}"
    return said + (", beside runs measured busy: load alone makes as much" if step.label == Label.BUSY else "")


def run_said(run_id: str) -> str:
    """An MLflow run id's first 12 characters; a run read from its folder, the folder's last two parts (a sweep's
    folder and the job's number: night-31/5)."""
    return "/".join(Path(run_id).parts[-2:]) if "/" in run_id else run_id[:12]


def _when(entry: Entry) -> str:
    return datetime.fromtimestamp(entry.started, UTC).strftime("%Y-%m-%d %H:%M")


def _label(step: Step) -> str:
    if step.significant:
        return str(step.label)
    return f"{step.label}, not significant across the store (q {step.q_value:.2g})"


def describe_number(history: History, name: str, step: Step) -> str:
    """'numeric change: max rel err vs float64 2.1e-07 → 8.4e-07 from run 3f2a… (2026-11-26 14:02; numpy 2.3.5 @
    0f5a11b0c3 → numpy 2.4.0 @ 91c2d7e4aa)': the metric's typical value either side, the versions either side."""
    before, after = number_levels(history, name, step)
    first = history.entries[step.index]
    earlier = next((e for e in reversed(history.entries[: step.index]) if name in e.numbers), first)
    versions = versions_said(earlier.version, first.version)
    what = f"{NUMBERS[name]} {format_number(name, before)} → {format_number(name, after)}"
    where = f"run {run_said(first.run_id)} ({_when(first)}{'; ' + versions if versions else ''})"
    return f"{_label(step)}: {what} from {where}"


def describe_figure(history: History, name: str, step: Step) -> str:
    """'first call: regression 1.43x [1.31–1.57] from run 3f2a… (2026-11-26 14:02): 702 ms → 1 s': the series named
    first, its label then its step."""
    before, after = figure_levels(history.entries, history.figures.get(name, []), name, step)
    levels = f"{format_figure(name, before)} → {format_figure(name, after)}"
    said = describe_step(history, step).replace(f"{_label(step)}: ", f"{_label(step)} ", 1)
    return f"{FIGURES[name].said}: {said}: {levels}"


def lines(histories: list[History], fdr: float | None = None) -> list[str]:
    """What `runner history` prints: per case and machine, its runs, its newest time, each step, and each change of
    its numbers; then, where the steps were held to a false-discovery rate `fdr`, what that says of them
    (fdr_summary)."""
    out = []
    for h in histories:
        newest = h.entries[-1]
        runs = f"{len(h.entries)} run{'s' if len(h.entries) != 1 else ''}"
        out.append(f"{h.case_name} on {h.machine_name}: {runs}, now {format_seconds(newest.typical_s)}")
        if h.is_control:
            out.append("  the control of the cases timed beside it: its steps are the machine's; no gate fails on them")
        if h.relative:
            ratio = next((e for e in reversed(h.entries) if not math.isnan(e.control_s)), newest)  # its newest ratio
            now = ratio.typical_s / ratio.control_s
            out.append(f"  fitted relative to its control, {h.control_name}, timed in the same rounds: now {now:.3g}x")
        out += [f"  {note}" for note in control_notes(h)]
        if times_read(h):
            out += [f"  {describe_step(h, s)}" for s in h.steps] or ["  no step"]
        if h.relative and times_read(h):
            out.append(f"  the times themselves: {'; '.join(describe_step(h, s) for s in h.raw_steps) or 'no step'}")
        out += [f"  {describe_number(h, name, s)}" for name, steps in h.numbers.items() for s in steps]
        out += [f"  {describe_figure(h, name, s)}" for name, steps in h.figures.items() for s in steps]
        out += [f"  {line}" for line in quiet_series(h)]
    return out + ([fdr_summary(histories, fdr)] if fdr is not None else [])


def control_notes(history: History) -> list[str]:
    """Each sweep whose control gave no time (Entry.control_lost), its runs and what was fitted instead: 'control killed
    in sweep 3f2a9c81d0e4 (terminated (SIGTERM) while timing): run 9c1e07d2b4a5 left out of the fit relative to its
    control'; where too few sweeps had its time to fit on (build.fits_relative), the history is fitted on its times,
    and the first line says so."""
    lost: dict[str, list[str]] = {}
    for entry in history.entries:
        if entry.control_lost:
            lost.setdefault(entry.control_lost, []).append(run_said(entry.run_id))
    if not lost:
        return []
    then = "left out of the fit relative to its control" if history.relative else "has no ratio to its control"
    said = [f"{why}: run{'s' if len(runs) > 1 else ''} {', '.join(runs)} {then}" for why, runs in lost.items()]
    if history.relative:
        return said
    sweeps = {e.sweep or e.run_id: not math.isnan(e.control_s) for e in history.entries}
    named = all(e.control_lost or not math.isnan(e.control_s) for e in history.entries)
    why = f"its control gave a time in {sum(sweeps.values())} of its {len(sweeps)} sweeps" if named else ""
    return [f"fitted on its times, not relative to its control: {why or 'some of its sweeps timed none'}", *said]


def quiet_series(history: History) -> list[str]:
    """Where the history was narrowed to some series (--series), each of them but the times with no step: 'first
    call: no step', or 'first-call compile: not recorded by its runs'."""
    if history.series is None:
        return []
    names = series_names()
    said = []
    for name in (n for n in names if n in history.series and n != TIMES):
        steps = history.figures.get(name, history.numbers.get(name))
        if steps is None:
            said.append(f"{names[name]}: not recorded by its runs")
        elif not steps:
            said.append(f"{names[name]}: no step")
    return said


def verdict(history: History) -> str:
    """The history's word on its newest run (its `history.verdict` tag): its newest step, or that there is none, then
    each change of its numbers that its newest runs carry (a step whose level reaches the newest run)."""
    step = history.newest_step()
    said = [describe_step(history, step) if step else f"no step in {len(history.entries)} runs"]
    for name, steps in history.numbers.items():
        said += [describe_number(history, name, steps[-1])] if steps else []
    return "; ".join(said)

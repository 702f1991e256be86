"""`runner history`: every case's series of runs on one machine, and the steps in it (when did it get slower, by how
much, is it real).

A case is the same work on the same configuration, seed and timing budget aside, and a machine is a kind of machine,
not a host (runner.identity): a CI runner pool's runs, each on another host of one kind, are one series (`--by-host`
splits it per host). Every run carries both as MLflow tags (`case`, `machine`), so a case's history is one filtered
search, not a scan of the store. Each run is its typical time, with the interval that runs made apart get
(runner.report.comparison.apart_interval: the machine's drift between runs and each process's own offset, calibrated
by A/A runs); the runs of one sweep (its MLflow parent run, or its sweep folder: seeds of one configuration, hosts of
one kind) are replicates, one point of the series together (in_time keeps them side by side). runner.history.steps
finds the steps, the noise between points from the scatter the series shows; a run tagged `history.change` (runner
history --mark RUN_ID) is a known change (a new machine, a driver): no alert there.

Many cases at once (control_fdr): a store of 100 quiet cases raises false alarms in proportion to their number, so
the steps of a store's series are held to a false-discovery rate together. Each step has a p-value (steps._p_value:
the detector's own t test, bounded over the places its search tried); Benjamini-Hochberg
(scipy.stats.false_discovery_control) adjusts them over every series but the controls, a series with no step counting
as one hypothesis at p = 1 (the detector keeps a step only at a p-value of steps.KEEP, 2%, or less, so a series
where it kept none is above that; taking it as 1 can only make BH more careful). A step whose q-value is above the
rate stays in the history, marked not significant across the store, and no gate fails on it. BH holds the expected
share of false steps among those kept to the rate where the series are independent or positively dependent (cases
timed on one machine drift together: positively).

Numbers over time (NUMBERS): each run's error against its float64 reference and, for a generation, the tokens that
differ from the reference's, are series too, fitted by the same detector; a step there is a NUMERIC change, named
with the versions either side. An exact result (error 0) counts as float64's epsilon, a run without the metric is
left out of that series.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

from runner.history.fdr import DEFAULT_FDR, control_fdr, fdr_summary
from runner.history.figures import FIGURES, figure_steps, format_figure, recorded_figures
from runner.history.figures import levels as figure_levels
from runner.history.gaps import Gap
from runner.history.numbers import (
    format_number,
    number_levels,
    numeric_steps,
    recorded_numbers,
    versions_said,
)
from runner.history.series import NUMBERS, Entry, History, either_side
from runner.history.steps import MIN_POINTS, Label, Step, find_steps
from runner.identity import Key
from runner.record.runs import Run, from_dirs
from runner.record.table import format_interval, format_ratio, format_seconds
from runner.report.comparison import load_could_make

CHANGE_TAG = "history.change"  # a curator's mark: the distribution changes at this run (why, as its value)
CONTROL_TAG = "control_case"  # the case of the control its sweep timed beside it (runner.launch.control)
CONFIRMED_TAG = "history.confirmed"  # runner.history.confirm's word on a flagged run: 'yes: ...' or 'no: ...'


def build(
    entries: list[tuple[str, str, str, str, Entry]],
    controls: dict[str, str] | None = None,
    control_cases: set[str] | None = None,
    fdr: float | None = DEFAULT_FDR,
) -> list[History]:
    """Histories from (case, case name, machine, machine name, entry) tuples, each series in time order with its
    steps and those of its numbers; the ones with a regression first, the newest regression first. A case named in
    `controls` (case -> its control's name) whose every run has its control's time is fitted relative to it, its raw
    steps kept beside; a case among `control_cases` is marked as the control it is. `fdr`: the false-discovery rate
    the steps are held to across the series (control_fdr; None: each series alone)."""
    controls, control_cases = controls or {}, control_cases or set()
    found: dict[tuple[str, str], History] = {}
    for case, case_name, machine, machine_name, entry in entries:
        found.setdefault((case, machine), History(case, case_name, machine, machine_name)).entries.append(entry)
    for history in found.values():
        history.entries = in_time(history.entries)
        history.steps = unless_busy(history.entries, find_steps([e.point() for e in history.entries]))
        history.is_control = history.case in control_cases
        if controls.get(history.case) and all(not math.isnan(e.control_s) for e in history.entries):
            history.control_name, history.raw_steps = controls[history.case], history.steps
            history.steps = unless_busy(history.entries, find_steps([e.point(relative=True) for e in history.entries]))
        history.numbers = numeric_steps(history.entries)
        history.figures = figure_steps(history.entries)
    histories = list(found.values())
    if fdr is not None:
        control_fdr(histories, fdr)
    return sorted(histories, key=_urgency)


def in_time(entries: list[Entry]) -> list[Entry]:
    """The runs in time order, the runs of one sweep side by side (from its first run's start): they are one point of
    the series."""
    first: dict[str, float] = {}
    for entry in entries:
        if entry.sweep:
            first[entry.sweep] = min(first.get(entry.sweep, entry.started), entry.started)
    return sorted(entries, key=lambda e: (first.get(e.sweep, e.started), e.started))


def unless_busy(entries: list[Entry], steps: list[Step]) -> list[Step]:
    """The steps, a regression or improvement that load alone could make (comparison.load_could_make) where a level
    either side of it was measured busy (its runs' median of other runnable threads) labelled BUSY: shown, and no gate
    fails on it. A load through a few nights slows a case's long calls, and not the control's short ones, so the
    control cannot cancel it; once the level's runs are mostly quiet again, a step that stays is a step again."""
    marked = []
    for step in steps:
        busy = max(statistics.median(e.busy for e in level) for level in either_side(entries, steps, step) if level)
        if step.label in (Label.REGRESSION, Label.IMPROVEMENT) and load_could_make((step.low, step.high), busy):
            step = replace(step, label=Label.BUSY)
        marked.append(step)
    return marked


def _urgency(history: History) -> tuple:
    regressions = [s for s in history.steps if s.label == Label.REGRESSION and s.significant]
    newest = max((history.entries[s.index].started for s in regressions), default=0.0)
    return (not regressions, -newest, history.case_name)


def from_runs(
    runs: list[Run], by_host: bool = False, control_runs: list[Run] | None = None, fdr: float | None = DEFAULT_FDR
) -> list[History]:
    """Histories of the timed runs among `runs` (runner.record.runs: from MLflow or run directories), one series per
    case and machine, or per case, machine and host (`by_host`). A run whose sweep timed a control (its control's
    run among `runs` or `control_runs`) carries the control's time, and a series all of whose runs do is fitted
    relative to it. `fdr`: as build's."""
    timed = [r for r in [*runs, *(control_runs or [])] if r.timed and r.identity and r.sweep]
    control_times = {(r.sweep, r.identity.case.key): r.typical_s for r in timed if r.identity}
    control_names = {r.identity.case.key: r.identity.case.name for r in timed if r.identity}
    controls: dict[str, str] = {}
    entries = []
    for run in runs:
        if not (run.timed and run.identity and not math.isnan(run.typical_s)):
            continue
        found = run.identity
        machine = (
            Key(f"{found.machine.key}@{found.host}", f"{found.host} ({found.machine.name})")
            if by_host
            else found.machine
        )
        control = run.tags.get(CONTROL_TAG, "")
        if control in control_names:
            controls[found.case.key] = control_names[control]
        entry = Entry(
            run_id=run.where,
            started=run.started,
            typical_s=run.typical_s,
            processes=int(run.metrics.get("n_processes") or 1),
            change=run.tags.get(CHANGE_TAG, ""),
            version=run.version,
            control_s=control_times.get((run.sweep, control), math.nan),
            numbers=recorded_numbers(run.metrics),
            figures=recorded_figures(run.metrics),
            confirmed=run.tags.get(CONFIRMED_TAG, ""),
            busy=float(run.metrics.get("machine_other_runnable") or 0.0),
            sweep=run.sweep,
            experiment_id=run.experiment_id,
        )
        entries.append((found.case.key, found.case.name, machine.key, machine.name, entry))
    return build(entries, controls, {r.tags[CONTROL_TAG] for r in runs if r.tags.get(CONTROL_TAG)}, fdr)


def describe_step(history: History, step: Step) -> str:
    """'regression: 1.10x [1.06–1.14] from run 3f2a… (2026-11-26 14:02, torch 2.14.1 @ 0f5a11b)', or 'insufficient
    data: 2 runs since 2026-11-26 14:02, 4 tell a step' ('6 runs in 3 sweeps since ..., 4 sweeps tell a step'); a
    step above the store's false-discovery rate says so after its label ('regression, not significant across the store
    (q 0.31): ...')."""
    first = history.entries[step.index]
    when = _when(first)
    if step.label == Label.INSUFFICIENT:
        since = history.entries[step.index :]
        runs, points = len(since), len({e.sweep or e.run_id for e in since})
        if points < runs:  # the runs of a sweep are one point
            return f"{step.label}: {runs} runs in {points} sweeps since {when}, {MIN_POINTS} sweeps tell a step"
        return f"{step.label}: {runs} run{'s' if runs != 1 else ''} since {when}, {MIN_POINTS} tell a step"
    interval = format_interval((step.low, step.high))
    where = f"run {run_said(first.run_id)} ({when}{', ' + first.version if first.version else ''})"
    said = f"{_label(step)}: {format_ratio(step.ratio)}{f' [{interval[:-1]}]' if interval else ''} from {where}"
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
    """'first call: regression 1.43x [1.31–1.57] from run 3f2a… (2026-11-26 14:02): 702 ms → 1 s'."""
    before, after = figure_levels(history.entries, name, step)
    levels = f"{format_figure(name, before)} → {format_figure(name, after)}"
    return f"{FIGURES[name].said}: {describe_step(history, step)}: {levels}"


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
            now = newest.typical_s / newest.control_s
            out.append(f"  fitted relative to its control, {h.control_name}, timed in the same rounds: now {now:.3g}x")
        out += [f"  {describe_step(h, s)}" for s in h.steps] or ["  no step"]
        if h.relative:
            out.append(f"  the times themselves: {'; '.join(describe_step(h, s) for s in h.raw_steps) or 'no step'}")
        out += [f"  {describe_number(h, name, s)}" for name, steps in h.numbers.items() for s in steps]
        out += [f"  {describe_figure(h, name, s)}" for name, steps in h.figures.items() for s in steps]
    return out + ([fdr_summary(histories, fdr)] if fdr is not None else [])


def failing(histories: list[History], labels: set[str]) -> list[str]:
    """The steps whose label is one of `labels` (runner history --fail-on), as printed: the times' (failing_steps),
    then the numbers' (failing_numbers)."""
    times = [f"{h.case_name}: {describe_step(h, s)}" for h, steps in failing_steps(histories, labels) for s in steps]
    figures = [
        f"{h.case_name}: {describe_figure(h, name, s)}"
        for h in histories
        if not h.is_control
        for name, steps in h.figures.items()
        for s in steps
        if str(s.label) in labels
    ]
    return times + failing_numbers(histories, labels) + figures


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
    return [
        f"{h.case_name}: {describe_number(h, name, s)}"
        for h in histories
        if not h.is_control
        for name, steps in h.numbers.items()
        for s in steps
        if s.significant
    ]


def fail_labels(text: str) -> set[str]:
    """--fail-on's labels ('regression,suspicious'), each checked against the labels a step can have; a label of two
    words may be given by its first ('numeric': 'numeric change')."""
    given = {label.strip() for label in text.split(",") if label.strip()}
    labels = [*map(str, Label), *map(str, Gap)]  # a step's, or a case's newest data: failing, missing
    known = {label: label for label in labels} | {label.split()[0]: label for label in labels}
    if given - known.keys():
        allowed = ", ".join(sorted(labels))
        raise LookupError(f"--fail-on {text}: {', '.join(sorted(given - known.keys()))} is no label ({allowed})")
    return {known[label] for label in given}


def verdict(history: History) -> str:
    """The history's word on its newest run (its `history.verdict` tag): its newest step, or that there is none, then
    each change of its numbers that its newest runs carry (a step whose level reaches the newest run)."""
    step = history.newest_step()
    said = [describe_step(history, step) if step else f"no step in {len(history.entries)} runs"]
    for name, steps in history.numbers.items():
        said += [describe_number(history, name, steps[-1])] if steps else []
    return "; ".join(said)


def read_confirmations(uri: str, histories: list[History]) -> None:
    """Each history's newest run given its CONFIRMED_TAG as the store holds it now (runner history --confirm has
    just tagged the runs it re-ran)."""
    from runner import tracking

    for h in histories:
        newest = h.entries[-1]
        tags = tracking.existing_run(uri, newest.run_id).get_run(newest.run_id).data.tags
        h.entries[-1] = replace(newest, confirmed=tags.get(CONFIRMED_TAG, ""))


def regressed_here(uri: str, run_dirs: list[Path]) -> list[str]:
    """A sweep's closing lines: for each case these runs measured, on their machine, its newest step where it is a
    regression (or suspicious) that starts at one of these runs."""
    from runner import tracking

    ours, cases = set(), set()
    for run in from_dirs(run_dirs):
        run_id = tracking.read_link(Path(str(run.run_dir))).get("run_id")
        if run_id and run.timed and run.identity:
            ours.add(run_id)
            cases.add((run.identity.case.key, run.identity.machine.key))
    lines = []
    for case, machine in sorted(cases):
        for h in from_runs(tracking.history_runs(uri, None, case, machine)):
            step = h.newest_step()
            if step is None or not step.significant or step.label not in (Label.REGRESSION, Label.SUSPICIOUS):
                continue
            if h.entries[step.index].run_id in ours:
                lines.append(f"history: {h.case_name}: {describe_step(h, step)} (runner history --case {case})")
    return lines

"""`runner history`: every case's series of runs on one machine, and the steps in it (when did it get slower, by how
much, is it real).

A case is the same work on the same configuration, seed and timing budget aside, and a machine is a kind of machine,
not a host (runner.identity): a CI runner pool's runs, each on another host of one kind, are one series (`--by-host`
splits it per host). Every run carries both as MLflow tags (`case`, `machine`), so a case's history is one filtered
search, not a scan of the store. Each run is its typical time, with the interval that runs made apart get
(runner.history.series.apart_interval: the machine's drift between runs and each process's own offset, calibrated
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

from runner.history.describe import run_said
from runner.history.fdr import DEFAULT_FDR, control_fdr
from runner.history.figures import FIGURES, figure_steps, recorded_figures
from runner.history.numbers import numeric_steps, recorded_numbers
from runner.history.series import Entry, History, either_side
from runner.history.steps import Label, Step, find_steps
from runner.history.tags import CHANGE_TAG, CONFIRMED_TAG
from runner.identity import Key
from runner.record.result import Status
from runner.record.runs import CONTROL_TAG, Run
from runner.report.comparison import load_could_make

# the smallest step in a time that a history reports: a series quiet enough resolved 0.4% (p 0.005) in identical
# sweeps on this VM (BENCHMARKS.md, *History: real sweeps of two seeds*), a move no gate should fail on
MIN_STEP = 0.01


def build(
    entries: list[tuple[str, str, str, str, Entry]],
    controls: dict[str, str] | None = None,
    control_cases: set[str] | None = None,
    fdr: float | None = DEFAULT_FDR,
) -> list[History]:
    """Histories from (case, case name, machine, machine name, entry) tuples, each series in time order with its
    steps and those of its numbers; the ones with a regression first, the newest regression first. A case named in
    `controls` (case -> its control's name) is fitted relative to it where fits_relative says, its raw steps kept
    beside; a case among `control_cases` is marked as the control it is. `fdr`: the false-discovery rate the steps
    are held to across the series (control_fdr; None: each series alone)."""
    controls, control_cases = controls or {}, control_cases or set()
    found: dict[tuple[str, str], History] = {}
    for case, case_name, machine, machine_name, entry in entries:
        found.setdefault((case, machine), History(case, case_name, machine, machine_name)).entries.append(entry)
    for history in found.values():
        history.entries = in_time(history.entries)
        history.steps = unless_busy(history.entries, find_steps([e.point() for e in history.entries], MIN_STEP))
        history.is_control = history.case in control_cases
        if controls.get(history.case) and fits_relative(history.entries):
            history.control_name, history.raw_steps = controls[history.case], history.steps
            relative = [e.point(relative=True) for e in history.entries]  # NaN where its control gave no time: out
            history.steps = unless_busy(history.entries, find_steps(relative, MIN_STEP))
        history.numbers = numeric_steps(history.entries)
        history.figures = {
            name: unless_busy(history.entries, steps) if FIGURES[name].load_moves else steps
            for name, steps in figure_steps(history.entries).items()
        }
    histories = list(found.values())
    if fdr is not None:
        control_fdr(histories, fdr)
    return sorted(histories, key=_urgency)


def fits_relative(entries: list[Entry]) -> bool:
    """Whether a series is fitted relative to its control: every run's sweep named one (a run whose sweep named none
    has no control_s and no control_lost), and it gave a time in most of its sweeps. A sweep whose control gave none
    (killed, failed: Entry.control_lost) costs that fit its own point only: its ratio is NaN, which the detector
    leaves out, and the times' own series keeps it."""
    if any(math.isnan(e.control_s) and not e.control_lost for e in entries):
        return False
    timed = {e.sweep or e.run_id: not math.isnan(e.control_s) for e in entries}
    return 2 * sum(timed.values()) > len(timed)


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
    fails on it; so are a figure's where load moves the figure (figures.Figure.load_moves: not memory). A load through
    a few nights slows a case's long calls, and not the control's short ones, so the control cannot cancel it; once
    the level's runs are mostly quiet again, a step that stays is a step again."""
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
    run among `runs` or `control_runs`) carries the control's time, or why it has none (control_lost: a control
    killed or failed, read from those runs too), and a series whose runs do is fitted relative to it
    (fits_relative). `fdr`: as build's."""
    in_sweeps = _controls_by_sweep([*runs, *(control_runs or [])])
    control_names = {case: run.identity.case.name for (_, case), run in in_sweeps.items() if run.identity}
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
        beside = in_sweeps.get((run.sweep, control)) if control and run.sweep else None
        entry = Entry(
            run_id=run.where,
            started=run.started,
            typical_s=run.typical_s,
            processes=int(run.metrics.get("n_processes") or 1),
            change=run.tags.get(CHANGE_TAG, ""),
            version=run.version,
            control_s=beside.typical_s if beside is not None and _usable(beside) else math.nan,
            numbers=recorded_numbers(run.metrics),
            figures=recorded_figures(run.metrics),
            confirmed=run.tags.get(CONFIRMED_TAG, ""),
            busy=float(run.metrics.get("machine_other_runnable") or 0.0),
            sweep=run.sweep,
            experiment_id=run.experiment_id,
            host=found.host,
            control_lost=control_lost(beside, run.sweep) if control and run.sweep else "",
        )
        entries.append((found.case.key, found.case.name, machine.key, machine.name, entry))
    return build(entries, controls, {r.tags[CONTROL_TAG] for r in runs if r.tags.get(CONTROL_TAG)}, fdr)


def _usable(run: Run) -> bool:
    return run.timed and not math.isnan(run.typical_s)


def _controls_by_sweep(runs: list[Run]) -> dict[tuple[str, str], Run]:
    """Each sweep's run of each case, by (sweep, case key), a finished one with a time before any other (a killed or
    failed one says why its sweep's control gave no time)."""
    found: dict[tuple[str, str], Run] = {}
    for run in runs:
        if run.identity and run.sweep:
            key = (run.sweep, run.identity.case.key)
            if key not in found or (_usable(run) and not _usable(found[key])):
                found[key] = run
    return found


def control_lost(control: Run | None, sweep: str) -> str:
    """Why a sweep's control gave no time ('' where it gave one), in the words a history says it: 'control killed in
    sweep 3f2a9c81d0e4 (terminated (SIGTERM) while timing)', 'control failed in sweep ... (ValueError: ...)', 'control
    not found in sweep ...' (not among the runs read). A killed control's time over the rounds before it was stopped
    is not used: the case's time spans rounds it did not run, so their drift would not cancel (docs/history.md)."""
    where = f"in sweep {run_said(sweep)}"
    if control is None:
        return f"control not found {where}"
    if _usable(control):
        return ""
    if control.status != Status.FINISHED:
        why = (control.error or "no error recorded").splitlines()[0]
        return f"control {str(control.status).lower()} {where} ({why})"
    return f"control without a typical time {where}"

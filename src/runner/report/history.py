"""`runner history`: every case's series of runs on one machine, and the steps in it (when did it get slower, by how
much, is it real).

A case is the same work on the same configuration, seed and timing budget aside, and a machine is a kind of machine,
not a host (runner.identity): a CI runner pool's runs, each on another host of one kind, are one series (`--by-host`
splits it per host). Every run carries both as MLflow tags (`case`, `machine`), so a case's history is one filtered
search, not a scan of the store. Each run is one point: its typical
time, with the interval that runs made apart get (runner.report.comparison.apart_interval: the machine's drift
between runs and each process's own offset, calibrated by A/A runs). runner.report.steps finds the steps; a run
tagged `history.change` (runner history --mark RUN_ID) is a known change (a new machine, a driver): no alert there.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from runner.identity import Key
from runner.record.runs import Run, from_dirs
from runner.record.table import format_interval, format_ratio, format_seconds
from runner.report.comparison import apart_interval, relative_interval
from runner.report.steps import MIN_POINTS, Label, Point, Step, find_steps

CHANGE_TAG = "history.change"  # a curator's mark: the distribution changes at this run (why, as its value)
CONTROL_TAG = "control_case"  # the case of the control its sweep timed beside it (runner.launch.control)


@dataclass(frozen=True)
class Entry:
    """One run of a case's series."""

    run_id: str  # its MLflow run id, or its directory where it was read from one
    started: float  # epoch seconds
    typical_s: float
    processes: int = 1
    change: str = ""  # why the distribution changes here, where a curator marked it
    version: str = ""  # what it ran with: the framework's version and the runner's commit
    control_s: float = math.nan  # the typical time of the control its sweep timed beside it (runner.launch.control)

    def point(self, relative: bool = False) -> Point:
        """Its typical time as a point of the series, or its ratio to its control (`relative`): measured in the same
        rounds, the machine's drift between sweeps cancels in it and only the two processes' offsets are left."""
        if relative:
            value = self.typical_s / self.control_s
            low, high = relative_interval(value, self.processes)
        else:
            value = self.typical_s
            low, high = apart_interval(value, self.processes)
        return Point(value, low, high, known_change=bool(self.change))


@dataclass
class History:
    """A case on one machine: its runs in time order and the steps found in them."""

    case: str
    case_name: str
    machine: str
    machine_name: str
    entries: list[Entry] = field(default_factory=list)
    steps: list[Step] = field(default_factory=list)
    control_name: str = ""  # the control the steps were found relative to ('' : fitted on the times themselves)
    is_control: bool = False  # the control of other series: its steps are the machine's, no gate fails on them
    raw_steps: list[Step] = field(default_factory=list)  # where relative: the steps of the times themselves

    @property
    def relative(self) -> bool:
        return bool(self.control_name)

    def newest_step(self) -> Step | None:
        return max(self.steps, key=lambda s: s.index, default=None)


def build(
    entries: list[tuple[str, str, str, str, Entry]],
    controls: dict[str, str] | None = None,
    control_cases: set[str] | None = None,
) -> list[History]:
    """Histories from (case, case name, machine, machine name, entry) tuples, each series in time order with its
    steps; the ones with a regression first, the newest regression first. A case named in `controls` (case -> its
    control's name) whose every run has its control's time is fitted relative to it, its raw steps kept beside; a
    case among `control_cases` is marked as the control it is."""
    controls, control_cases = controls or {}, control_cases or set()
    found: dict[tuple[str, str], History] = {}
    for case, case_name, machine, machine_name, entry in entries:
        found.setdefault((case, machine), History(case, case_name, machine, machine_name)).entries.append(entry)
    for history in found.values():
        history.entries.sort(key=lambda e: e.started)
        history.steps = find_steps([e.point() for e in history.entries])
        history.is_control = history.case in control_cases
        if controls.get(history.case) and all(not math.isnan(e.control_s) for e in history.entries):
            history.control_name, history.raw_steps = controls[history.case], history.steps
            history.steps = find_steps([e.point(relative=True) for e in history.entries])
    return sorted(found.values(), key=_urgency)


def _urgency(history: History) -> tuple:
    regressions = [s for s in history.steps if s.label == Label.REGRESSION]
    newest = max((history.entries[s.index].started for s in regressions), default=0.0)
    return (not regressions, -newest, history.case_name)


def from_runs(runs: list[Run], by_host: bool = False, control_runs: list[Run] | None = None) -> list[History]:
    """Histories of the timed runs among `runs` (runner.record.runs: from MLflow or run directories), one series per
    case and machine, or per case, machine and host (`by_host`). A run whose sweep timed a control (its control's
    run among `runs` or `control_runs`) carries the control's time, and a series all of whose runs do is fitted
    relative to it."""
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
        )
        entries.append((found.case.key, found.case.name, machine.key, machine.name, entry))
    return build(entries, controls, {r.tags[CONTROL_TAG] for r in runs if r.tags.get(CONTROL_TAG)})


def step_record(history: History, step: Step) -> dict:
    """A step for --json: the first run after it (id, start), after / before with its interval, its label."""
    first = history.entries[step.index]
    return {
        "run_id": first.run_id,
        "start_time": datetime.fromtimestamp(first.started, UTC).isoformat(),
        "index": step.index,
        "ratio": step.ratio,
        "low": step.low,
        "high": step.high,
        "label": str(step.label),
    }


def to_json(histories: list[History]) -> str:
    """Per case and machine: its names, its runs and the steps found (step_record); strict JSON, a number that is
    not one (an interval a run lacks) as null."""
    return json.dumps(
        _strict(
            [
                {
                    "case": h.case,
                    "case_name": h.case_name,
                    "machine": h.machine,
                    "machine_name": h.machine_name,
                    "runs": [asdict(e) for e in h.entries],
                    "fitted": f"relative to {h.control_name}" if h.relative else "times",
                    "steps": [step_record(h, s) for s in h.steps],
                    "raw_steps": [step_record(h, s) for s in h.raw_steps],
                }
                for h in histories
            ]
        ),
        indent=1,
        allow_nan=False,
    )


def _strict(value):
    """NaN and infinities as None, everywhere in a structure of lists and dicts, as strict JSON has no such number."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _strict(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_strict(v) for v in value]
    return value


def describe_step(history: History, step: Step) -> str:
    """'regression: 1.10x [1.06–1.14] from run 3f2a… (2026-11-26 14:02, torch 2.14.1 @ 0f5a11b)', or 'insufficient
    data: 2 runs since 2026-11-26 14:02, 4 tell a step'."""
    first = history.entries[step.index]
    when = datetime.fromtimestamp(first.started, UTC).strftime("%Y-%m-%d %H:%M")
    if step.label == Label.INSUFFICIENT:
        runs = len(history.entries) - step.index
        return f"{step.label}: {runs} run{'s' if runs != 1 else ''} since {when}, {MIN_POINTS} tell a step"
    interval = format_interval((step.low, step.high))
    where = f"run {first.run_id[:12]} ({when}{', ' + first.version if first.version else ''})"
    return f"{step.label}: {format_ratio(step.ratio)}{f' [{interval[:-1]}]' if interval else ''} from {where}"


def lines(histories: list[History]) -> list[str]:
    """What `runner history` prints: per case and machine, its runs, its newest time and each step."""
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
    return out


def failing(histories: list[History], labels: set[str]) -> list[str]:
    """The steps whose label is one of `labels` (runner history --fail-on), as printed."""
    return [f"{h.case_name}: {describe_step(h, s)}" for h, steps in failing_steps(histories, labels) for s in steps]


def failing_steps(histories: list[History], labels: set[str]) -> list[tuple[History, list[Step]]]:
    """Per history, its steps whose label is one of `labels`; a control's own series aside (its steps are the whole
    machine's, which the series fitted relative to it have cancelled)."""
    found = [(h, [s for s in h.steps if str(s.label) in labels]) for h in histories if not h.is_control]
    return [(h, steps) for h, steps in found if steps]


def fail_labels(text: str) -> set[str]:
    """--fail-on's labels ('regression,suspicious'), each checked against the labels a step can have."""
    labels = {label.strip() for label in text.split(",") if label.strip()}
    allowed = {str(label) for label in Label}
    if labels - allowed:
        raise LookupError(
            f"--fail-on {text}: {', '.join(sorted(labels - allowed))} is no label ({', '.join(sorted(allowed))})"
        )
    return labels


def verdict(history: History) -> str:
    """The history's word on its newest run (its `history.verdict` tag): its newest step, or that there is none."""
    step = history.newest_step()
    return describe_step(history, step) if step else f"no step in {len(history.entries)} runs"


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
            if step and step.label in (Label.REGRESSION, Label.SUSPICIOUS) and h.entries[step.index].run_id in ours:
                lines.append(f"history: {h.case_name}: {describe_step(h, step)} (runner history --case {case})")
    return lines

"""What a history of times cannot show: a case whose newest runs failed, and a case that stopped appearing while its
machine went on. Both are dropped from the series (only finished, timed runs are points), so a nightly gate stayed
green while the case it guarded no longer ran; here each is said in one line and gated (`--fail-on failure,missing`).
A case whose newest runs were stopped (KILLED: Ctrl-C, or SIGTERM from scancel or a CI job's timeout) is said too, and
gated by nothing: a user who stopped a sweep fails no gate, and a timeout is the CI job's own failure.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import UTC, datetime
from enum import StrEnum
from itertools import groupby
from pathlib import Path

from runner.identity import machine_facts
from runner.record.result import RESULT_FILE, Status
from runner.record.runs import Run

MISSING_AFTER = 3  # sweeps of its machine without a case before it is `no data since` (--missing-after)


class Gap(StrEnum):
    FAILURE = "failure"  # its newest runs failed
    MISSING = "missing"  # its machine ran sweeps of its experiment since its last run, without it
    STOPPED = "stopped"  # its newest runs were stopped from outside (KILLED): said, never gated


GATED = (Gap.FAILURE, Gap.MISSING)  # what --fail-on takes


@dataclass(frozen=True)
class Gapped:
    """A case on one kind of machine whose newest data is a failure, or none."""

    gap: Gap
    case: str
    case_name: str
    machine: str
    machine_name: str
    since_run: str  # the first failed (or stopped) run, or the case's last run
    since: float  # its start, epoch seconds (what `dated` says it is; 0.0 where nothing dates it)
    count: int  # the failed (or stopped) runs since, or the machine's sweeps since without the case
    error: str = ""  # the newest failed (or stopped) run's error line
    dated: str = "started"  # what `since` is: the run's start, when its record was written (`recorded`), `unknown`

    def line(self) -> str:
        """'mlp gradients on AMD EPYC · 2 cores: failing since run abc (2026-12-04 16:00): 2 runs failed, the last:
        ValueError: ...', or '...: no data since 2026-12-01 03:00: 3 sweeps of its machine since ran without it', or
        '...: stopped since run abc (...): 1 run stopped, the last: terminated (SIGTERM) while timing; no gate fails on
        a stopped run'. A run that recorded no start is dated by its record ('recorded 2026-12-04 16:00'), else 'date
        unknown': never 1970."""
        date = datetime.fromtimestamp(self.since, UTC).strftime("%Y-%m-%d %H:%M")
        where = f"{self.case_name} on {self.machine_name}"
        if self.gap in (Gap.FAILURE, Gap.STOPPED):
            when = {"started": date, "recorded": f"recorded {date}"}.get(self.dated, "date unknown")
            failed = self.gap == Gap.FAILURE
            runs = f"{self.count} run{'s' if self.count != 1 else ''} {'failed' if failed else 'stopped'}"
            said = f"{'failing' if failed else 'stopped'} since run {self.since_run} ({when}): {runs}"
            return f"{where}: {said}, the last: {self.error}{'' if failed else '; no gate fails on a stopped run'}"
        when = date if self.dated != "unknown" else "a run of unknown date"
        return f"{where}: no data since {when}: {self.count} sweeps of its machine since ran without it"


def gaps(runs: list[Run], missing_after: int = MISSING_AFTER) -> list[Gapped]:
    """The cases among `runs` (finished, failed and killed, with an identity) whose newest runs failed, then those
    absent from at least `missing_after` of their machine's newest sweeps, then those whose newest runs were stopped
    (a control's aside: its sweep's cases say it, build.control_lost). A failed run that recorded no machine is put
    on its host's (placed); one left on none is the case's failure on a machine unknown, and no machine's sweep."""
    said = [r for r in runs if r.identity is not None and (r.status in (Status.FINISHED, Status.FAILED) or _stop(r))]
    everything = placed(sorted(said, key=when))
    ran = [r for r in everything if r.status != Status.KILLED]  # a stopped run neither fails nor clears a failure
    failing = _since(ran, Gap.FAILURE, Status.FAILED)
    return failing + _missing([r for r in ran if not _unknown(r)], missing_after) + _since(everything, Gap.STOPPED)


def _stop(run: Run) -> bool:
    return run.status == Status.KILLED and not run.is_control


def _key(run: Run) -> tuple[str, str]:
    assert run.identity is not None
    return run.identity.case.key, run.identity.machine.key


def _since(ran: list[Run], gap: Gap, status: str = Status.KILLED) -> list[Gapped]:
    """Per case and machine, its runs of `status` (failed, or stopped) since its last of another. Those on no machine
    known (placed found none) end at the case's next finished run on any machine: none could finish on a machine
    unknown."""
    finished: dict[str, list[Run]] = {}
    for run in ran:
        if run.status == Status.FINISHED and run.identity is not None:
            finished.setdefault(run.identity.case.key, []).append(run)
    found = []
    for (case, _), series in groupby(sorted(ran, key=_key), key=_key):
        ordered = list(series)
        ordered = sorted([*ordered, *finished.get(case, [])] if _unknown(ordered[0]) else ordered, key=when)
        trailing = len(ordered) - max((i + 1 for i, r in enumerate(ordered) if r.status != status), default=0)
        if trailing:
            first, last = ordered[-trailing], ordered[-1]
            found.append(_gapped(gap, first, trailing, (last.error or "no error recorded").splitlines()[0]))
    return found


def _missing(ran: list[Run], after: int) -> list[Gapped]:
    """Per kind of machine and MLflow experiment, its sweeps in time order (a single run its own); a case whose last
    run came `after` or more sweeps before the newest. Another experiment's runs on the machine (a user's runs beside
    the nightly sweeps) say nothing of what the nightly sweeps left out."""
    found = []
    machine_of = lambda r: (r.identity.machine.key, r.experiment_id)  # noqa: E731
    for _, on_machine in groupby(sorted(ran, key=machine_of), key=machine_of):
        runs = sorted(on_machine, key=when)
        sweeps = list(dict.fromkeys(r.sweep or r.where for r in runs))  # in the order they began
        last_run = {_key(r): r for r in runs}  # each case's newest run on this machine
        for run in last_run.values():
            since = len(sweeps) - 1 - sweeps.index(run.sweep or run.where)
            if since >= after:
                found.append(_gapped(Gap.MISSING, run, since))
    return found


def _gapped(gap: Gap, run: Run, count: int, error: str = "") -> Gapped:
    found = run.identity
    assert found is not None
    name = run.run_id or "/".join(Path(run.run_dir or run.name).parts[-2:])  # a folder's run: sweep/job
    since, dated = when(run), "started" if run.started else "recorded" if when(run) else "unknown"
    return Gapped(gap, found.case.key, found.case.name, found.machine.key, machine_said(run), name, since, count,
                  error, dated)  # fmt: skip


def when(run: Run) -> float:
    """When a run began, epoch seconds: its start; where it recorded none (a SLURM block whose node was lost before
    its job began, read from its folder: runner.launch.slurm.record_slurm_end), when its record was written (its
    result file's time, at the sweep's end), else 0.0 (unknown). In MLflow a run's start is never missing (a run
    logged without one starts when it was logged)."""
    if run.started or not run.run_dir:
        return run.started
    record = Path(run.run_dir) / RESULT_FILE
    return record.stat().st_mtime if record.is_file() else 0.0


def machine_said(run: Run) -> str:
    """The run's kind of machine as a line names it; where it recorded none (a SLURM block whose node was lost before
    the job read its machine: runner.launch.slurm.record_slurm_end), what is known: the machine its host ran the case
    on (placed), 'AMD EPYC 7B13 · 2 cores · 24 GiB (node-2, as its other runs of the case recorded it)', else
    'node-2 (machine unknown)', its host or the node SLURM placed it on, else 'machine unknown'; never blank."""
    assert run.identity is not None
    name = run.identity.machine.name
    if name and no_machine(run):
        return f"{name} ({run.host}, as its other runs of the case recorded it)"
    if name:
        return name
    return f"{run.host} (machine unknown)" if run.host else "machine unknown"


def no_machine(run: Run) -> bool:
    """Whether a run recorded none of its machine's facts (runner.identity.MACHINE): a SLURM block whose node was lost
    before its job read them is recorded with SLURM's reason and node alone."""
    return not any(machine_facts(run.environment).values())


def _unknown(run: Run) -> bool:
    """On no machine known: it recorded none, and placed found none."""
    return run.identity is not None and not run.identity.machine.name


def placed(ran: list[Run]) -> list[Run]:
    """The runs (in time order), each that recorded no machine put on the kind of machine its host (or the node SLURM
    placed it on) ran its case on, as its run of the case there nearest before it says, else nearest after it (a
    host is one kind of machine; its case's runs there recorded which). The case's runs only: a thread count set in
    the environment is part of a machine's kind, and another case's may differ. One whose host ran the case nowhere
    among `ran` stays on none (_unknown)."""
    on_host: dict[tuple[str, str], list[Run]] = {}
    for run in ran:
        if run.identity is not None and run.host and not no_machine(run):
            on_host.setdefault((run.host, run.identity.case.key), []).append(run)
    return [_on_hosts_machine(run, on_host) if no_machine(run) else run for run in ran]


def _on_hosts_machine(run: Run, on_host: dict[tuple[str, str], list[Run]]) -> Run:
    assert run.identity is not None
    there = on_host.get((run.host, run.identity.case.key), [])
    if not there:
        return run
    before = [r for r in there if when(r) <= when(run)]
    nearest = before[-1] if before else there[0]
    assert nearest.identity is not None
    return replace(run, identity=replace(run.identity, machine=nearest.identity.machine))

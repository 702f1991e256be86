"""`runner history`'s reads and writes of a store: the histories read from MLflow (or run folders), each read leaving
the store as it was; what is written only where a write is asked for: a known change marked (--mark), the verdicts and
pages recorded (--record); and a sweep's closing lines on the steps its runs started."""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

from runner import identity
from runner.history.build import from_runs
from runner.history.describe import describe_step, verdict
from runner.history.fdr import DEFAULT_FDR
from runner.history.gaps import MISSING_AFTER, Gapped, gaps, no_machine
from runner.history.page import page_name
from runner.history.series import History
from runner.history.steps import Label
from runner.history.tags import CHANGE_TAG, VERDICT_TAG
from runner.record.result import RESULT_FILE, Status
from runner.record.runs import CONTROL_TAG, Run, from_dirs


@dataclass(frozen=True)
class Query:
    """Which runs make the histories, and how they are held (runner history's options)."""

    experiment: str | None = None
    case: str | None = None
    machine: str | None = None
    by_host: bool = False  # a series per host too
    fdr: float = DEFAULT_FDR
    missing_after: int = MISSING_AFTER


def histories(uri: str, dirs: list[Path], query: Query) -> tuple[list[History], list[Gapped]]:
    """The histories of the runs in `dirs` (run or sweep folders, or any folder above them), or else of the store
    `uri`, and the cases whose newest runs failed or that stopped appearing (runner.history.gaps). Nothing is
    written: a read-only user of a team's server reads a history too."""
    from runner import tracking

    if dirs:
        ran = [run for path in dirs for run in _runs(path) if _asked(run, query)]
        found = from_runs(ran, query.by_host, fdr=query.fdr)
    else:
        measured = tracking.history_runs(uri, query.experiment, query.case, query.machine)
        failed, stopped = (tracking.history_runs(uri, query.experiment, query.case, query.machine, status=status)
                           for status in (Status.FAILED, Status.KILLED))  # fmt: skip
        ran = measured + failed + stopped + _machineless_failures(uri, query)
        found = from_runs(measured, query.by_host, control_runs(uri, measured), query.fdr)
    gapped = [g for g in gaps(ran, query.missing_after) if query.machine in (None, g.machine)]
    if not found and not gapped:
        raise LookupError("no finished run with a case and a typical time there")
    return found, gapped


def _asked(run: Run, query: Query) -> bool:
    """Whether a folder's run is of the case and machine --case and --machine name (MLflow filters a store's on its
    tags); one that recorded no machine is kept for gaps.placed to put where its node ran the case."""
    if run.identity is None:
        return not (query.case or query.machine)
    case, machine = run.identity.case.key, run.identity.machine.key
    return query.case in (None, case) and (query.machine in (None, machine) or no_machine(run))


def _machineless_failures(uri: str, query: Query) -> list[Run]:
    """With --machine, the failed runs that recorded no machine (a lost SLURM block's): gaps.placed puts each on the
    machine its node ran the case on, and those it puts on this one are this machine's failures."""
    from runner import tracking

    unknown = identity.machine({}).key  # the key of no facts, which such a run is tagged with
    if query.machine in (None, unknown):
        return []
    return tracking.history_runs(uri, query.experiment, query.case, unknown, status=Status.FAILED)


def control_runs(uri: str, measured: list[Run]) -> list[Run]:
    """The runs of the controls the `measured` runs' sweeps named (CONTROL_TAG), of any experiment and machine (each
    is paired with its own sweep's: build.from_runs); a killed or failed control's run too: its sweep's cases say why
    it gave no time."""
    from runner import tracking

    control_cases = {r.tags[CONTROL_TAG] for r in measured if r.tags.get(CONTROL_TAG)}
    return [
        r
        for case in sorted(control_cases)
        for status in (Status.FINISHED, Status.KILLED, Status.FAILED)
        for r in tracking.history_runs(uri, None, case, status=status)
    ]


def _runs(path: Path) -> list:
    """The runs in a folder: a run's, a sweep's, or any below it (outputs/, outputs/multirun/2026-11-28/)."""
    if not path.is_dir():
        raise FileNotFoundError(f"{path} is not a directory")
    return from_dirs(sorted(p.parent for p in path.rglob(RESULT_FILE)))


def mark(uri: str | None, run_id: str, why: str | None) -> str:
    """--mark RUN_ID --why TEXT: a known change at this run (the one write a curator asks for), said in a line."""
    from runner import tracking

    if not uri:
        raise LookupError("--mark needs --tracking-uri (or MLFLOW_TRACKING_URI)")
    why = why or "known change"
    tracking.set_tags(uri, run_id, {CHANGE_TAG: why})
    return f"marked run {run_id}: {why} (no alert at it; the series before and after are fitted apart)"


def record(uri: str, found: list[History]) -> None:
    """--record: each case's newest run tagged with its history's verdict (VERDICT_TAG), for the MLflow UI."""
    from runner import tracking

    for h in found:
        tracking.set_tags(uri, h.entries[-1].run_id, {VERDICT_TAG: verdict(h)})


def log_pages(uri: str, found: list[History], folder: Path) -> str:
    """--record with --html: each case's page as MLflow's artifact viewer shows it, and its plot, written into
    `folder` (page.write's `viewer`), as artifacts of the case's newest run under `history/`, where a person looking
    at the runs finds them beside its verdict; and the page (its plot inside it) at the top of that run's sweep's
    parent run as `history-CASE.html`, two clicks from the sweep's page (Artifacts, the file); said in a line."""
    from runner import tracking

    for h in found:
        newest = h.entries[-1]
        files = [folder / f"{page_name(h)}.html", folder / f"{page_name(h)}.png"]
        tracking.log_files(uri, newest.run_id, files, "history")
        if newest.sweep and newest.sweep.isalnum():  # its MLflow parent run (a folder's sweep is a path)
            beside = folder / f"history-{page_name(h)}.html"
            shutil.copyfile(files[0], beside)
            tracking.log_files(uri, newest.sweep, [beside])
    return "logged each case's page to its newest run in MLflow (artifacts: history/) and to its sweep's parent run"


def regressed_here(uri: str, run_dirs: list[Path]) -> list[str]:
    """A sweep's closing lines: for each case these runs measured, on their machine, its newest step where it is a
    regression (or suspicious) that starts at one of these runs; fitted as the command it names (`runner history`
    with the case's and machine's keys) fits it, relative to its control where its sweeps timed one (control_runs), so
    that the two say the same, its false-discovery rate held over the same series. The control's own series
    is the machine's, as there: no line of it."""
    from runner import tracking

    ours, cases = set(), set()
    for run in from_dirs(run_dirs):
        run_id = tracking.read_link(Path(str(run.run_dir))).get("run_id")
        if run_id and run.timed and run.identity and not run.is_control:
            ours.add(run_id)
            cases.add((run.identity.case.key, run.identity.machine.key))
    lines = []
    for case, machine in sorted(cases):
        measured = tracking.history_runs(uri, None, case, machine)
        for h in from_runs(measured, control_runs=control_runs(uri, measured)):
            step = h.newest_step()
            if step is None or not step.significant or step.label not in (Label.REGRESSION, Label.SUSPICIOUS):
                continue
            if h.entries[step.index].run_id in ours:
                shows = f"runner history --case {case} --machine {machine}"
                lines.append(f"history: {h.case_name}: {describe_step(h, step)} ({shows})")
    return lines

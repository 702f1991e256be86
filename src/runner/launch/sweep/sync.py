"""`runner sync` of a sweep kept locally: its parent run (created now if the store was down), then its jobs, each
adopted by that parent where it ran without one; the parent closed with the sweep's status."""

from __future__ import annotations

from pathlib import Path

from runner import tracking
from runner.config import first_line
from runner.launch.sweep.lifecycle import Sweep, close_parent, sweep_status
from runner.record.result import Status
from runner.record.runs import runs_in
from runner.record.sweep_file import SWEEP_FILE, read_sweep_file, write_sweep_file


def sync_path(path: Path, uri: str | None) -> list[tracking.Synced]:
    """`runner sync PATH`: one run directory (a sweep's job as its parent's child), or every job of a sweep directory
    (creating its parent run if missing)."""
    if (path / tracking.TRACKING_FILE).exists():
        in_sweep = (path.parent / SWEEP_FILE).exists()
        return sync_job(path, uri) if in_sweep else [tracking.sync_one(path, uri)]
    if (path / SWEEP_FILE).exists():
        return sync_sweep(path, uri)
    detail = f"neither {tracking.TRACKING_FILE} nor {SWEEP_FILE} here (not a tracked run)"
    return [tracking.Synced(path, tracking.SyncState.FAILED, detail)]


def sync_sweep(sweep_dir: Path, uri: str | None) -> list[tracking.Synced]:
    """Upload a sweep kept locally: its parent run (created now if the store was down), then its jobs."""
    return _sync(Path(sweep_dir), uri, None)


def sync_job(run_dir: Path, uri: str | None) -> list[tracking.Synced]:
    """Upload one job of a sweep as its parent's child (the parent created now if the store was down when the sweep
    began), and close the parent once every job of the sweep is in the store: syncing the job folders one by one
    leaves what syncing the sweep folder leaves."""
    return _sync(Path(run_dir).parent, uri, Path(run_dir))


def _sync(sweep_dir: Path, uri: str | None, only: Path | None) -> list[tracking.Synced]:
    info = read_sweep_file(sweep_dir)
    if info.get("tracking") != "mlflow":
        detail = "this sweep ran with tracking=none: there is nothing to upload"
        return [tracking.Synced(sweep_dir, tracking.SyncState.FAILED, detail)]
    info["uri"] = uri or info.get("uri")
    done: list[tracking.Synced] = []
    if not info.get("parent_run_id"):
        try:
            info["parent_run_id"] = tracking.create_parent_run(info)
        except Exception as error:
            detail = f"could not create the parent run ({first_line(error)})"
            return [tracking.Synced(sweep_dir, tracking.SyncState.FAILED, detail)]
        info.pop("error", None)
        write_sweep_file(sweep_dir, info)
        done.append(tracking.Synced(sweep_dir, tracking.SyncState.CREATED, info["parent_run_id"]))
    run_dirs = job_dirs(sweep_dir)
    for run_dir in [only] if only else run_dirs:
        _adopt(run_dir, info["parent_run_id"])
        done.append(tracking.sync_one(run_dir, uri))
    if only and not all(_synced(d) for d in run_dirs):
        return done  # the parent stays open until its last job is in the store
    statuses = [job_status(d) for d in run_dirs]
    # A sweep that never reached `finish` was stopped (its launcher killed): never FINISHED.
    status = info.get("status") or sweep_status(statuses, interrupted=True)
    files = [sweep_dir / "summary.md", sweep_dir / tracking.GUIDE, *sorted((sweep_dir / "report").glob("*"))]
    files = [p for p in files if p.is_file()]
    changed = any(synced.state != tracking.SyncState.ALREADY for synced in done)
    if changed or not info.get("parent_closed"):
        close_parent(Sweep(sweep_dir, info), statuses, status, files)
    return done


def _synced(run_dir: Path) -> bool:
    try:
        return bool(tracking.read_link(run_dir).get("synced"))
    except ValueError:  # an unreadable tracking.json: not in the store
        return False


def job_dirs(sweep_dir: Path) -> list[Path]:
    """The job directories of a sweep: those with a result, and those whose job never recorded one."""
    found = set(runs_in(sweep_dir))
    found |= {p.parent for p in Path(sweep_dir).glob(f"*/{tracking.TRACKING_FILE}")}
    return sorted(found, key=lambda d: (not d.name.isdigit(), int(d.name) if d.name.isdigit() else 0, d.name))


def job_status(run_dir: Path) -> str:
    """A job's recorded status; an unreadable record is FAILED, a missing one KILLED."""
    from runner.record.result import Result, ResultUnreadable

    if not Result.exists(run_dir):
        return Status.KILLED
    try:
        return Result.load(run_dir).status
    except ResultUnreadable:
        return Status.FAILED


def _adopt(run_dir: Path, parent_id: str) -> None:
    """A job that ran while there was no parent run becomes a child of the one created at sync."""
    try:
        link = tracking.read_link(run_dir)
    except ValueError:  # an unreadable tracking.json: its sync says so
        return
    if link and not link.get("synced") and not link.get("parent_run_id"):
        tracking.write_link(run_dir, {**link, "parent_run_id": parent_id})

"""The temporary folders of a job's other worker processes (timing.processes, runner.launch.rounds).

Each is named for the launcher that made it: `{job}.{number}-runner-process-{launcher pid}-{random}`. The launcher
removes the folder when it dismisses the worker, and the worker dies with its launcher (a parent-death signal); a
killed launcher leaves its folders behind, and the next launch on the machine removes them. A folder whose launcher
still runs, one of another user, or one named without a launcher (made by an older version) is left alone.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from pathlib import Path

MARK = "-runner-process-"
_LAUNCHER = re.compile(rf"{MARK}(\d+)-[^/]*$")


def make(job: str, number: int) -> Path:
    """A new folder in the temporary directory for the job's process `number`, named for this launcher."""
    return Path(tempfile.mkdtemp(prefix=f"{job}.{number}{MARK}{os.getpid()}-"))


def remove_orphans(folder: Path | None = None) -> list[Path]:
    """Remove the worker folders in `folder` (default: the temporary directory) whose launcher no longer runs;
    returns those removed."""
    folder = Path(tempfile.gettempdir()) if folder is None else folder
    orphans = [path for path in folder.glob(f"*{MARK}*") if _orphan(path)]
    for path in orphans:
        shutil.rmtree(path, ignore_errors=True)
    return orphans


def _orphan(path: Path) -> bool:
    named = _LAUNCHER.search(path.name)
    if named is None or path.is_symlink() or not path.is_dir():
        return False
    try:
        own = path.stat().st_uid == os.getuid()
    except FileNotFoundError:  # another launch removed it meanwhile
        return False
    return own and not _may_run(int(named[1]))


def _may_run(pid: int) -> bool:
    """Whether a process with this id may exist (a zombie does: its parent has not reaped it yet)."""
    if pid <= 0:  # 0 and below name process groups, never one process
        return True
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, OverflowError):  # none, or beyond any process id
        return False
    except PermissionError:  # another user's
        return True
    return True

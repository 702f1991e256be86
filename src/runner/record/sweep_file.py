"""sweep.json: what a sweep is, in its directory (overrides, launcher, store, parent run, status), written by
the launching process and read by every job, wherever it runs, and by reports."""

from __future__ import annotations

import json
from pathlib import Path

SWEEP_FILE = "sweep.json"


def write_sweep_file(sweep_dir: Path, content: dict) -> None:
    (Path(sweep_dir) / SWEEP_FILE).write_text(json.dumps(content, indent=2) + "\n")


def read_sweep_file(sweep_dir: Path) -> dict:
    path = Path(sweep_dir) / SWEEP_FILE
    return json.loads(path.read_text()) if path.exists() else {}


def note_control(sweep_dir: Path, number: int, folder: str, case: str, case_name: str) -> None:
    """A sweep's control case (runner.launch.control), in its sweep.json: its job's number and folder, its case."""
    info = read_sweep_file(sweep_dir)
    noted = {"job": number, "folder": folder, "case": case, "case_name": case_name}
    write_sweep_file(sweep_dir, {**info, "control": noted})


def control_of(run_dir: Path) -> dict:
    """The control case of the sweep a run belongs to, {"job", "folder", "case", "case_name"}; {} where it has
    none."""
    return read_sweep_file(Path(run_dir).parent).get("control") or {}

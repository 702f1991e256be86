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

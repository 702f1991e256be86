"""tracking.json, a run directory's link to its MLflow run: where (and whether) the run reached MLflow,
written before the job starts."""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path

from runner.config import ConfigError

TRACKING_FILE = "tracking.json"  # where (and whether) the run reached MLflow


def run_key(run_dir: Path) -> str:
    """A stable key for one run of one directory: its absolute path and the time it started."""
    text = f"{Path(run_dir).resolve()}@{time.time_ns()}"
    return hashlib.sha1(text.encode(), usedforsecurity=False).hexdigest()


def read_link(run_dir: Path) -> dict:
    path = Path(run_dir) / TRACKING_FILE
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except ValueError:
        raise ConfigError(f"{path} cannot be read (not JSON): upload with runner sync --tracking-uri URI") from None


def write_link(run_dir: Path, link: dict) -> None:
    """tracking.json, whole or not at all."""
    path = Path(run_dir) / TRACKING_FILE
    temporary = path.with_name(f".{TRACKING_FILE}.{os.getpid()}.tmp")
    temporary.write_text(json.dumps(link, indent=2) + "\n")
    os.replace(temporary, path)


def write_pending(run_dir: Path, uri: str, experiment: str, parent_run_id: str | None) -> None:
    """Before the job starts: where it is to be logged, so that `runner sync` can upload it whatever happens."""
    link = {"uri": uri, "experiment": experiment, "parent_run_id": parent_run_id, "run_key": run_key(run_dir)}
    write_link(run_dir, {**link, "run_id": None, "synced": False})


def read_link_or_empty(run_dir: Path) -> dict:
    try:
        return read_link(run_dir)
    except ConfigError:
        return {}

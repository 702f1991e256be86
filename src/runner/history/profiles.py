"""Where a step's time went: the profiles (timing.profile, runner.measure.profile) of the nearest profiled run before a
step and the nearest from it on, and the functions whose self time per call moved most between them, largest move
first. Each profile is the run's `profile.json`, read from its folder or its MLflow run's artifacts (downloaded to a
temporary folder: the store is read, never written)."""

from __future__ import annotations

import json
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from runner.history.series import Entry, History
from runner.history.steps import Step
from runner.record.result import PROFILE_SUMMARY

Reader = Callable[[Entry], dict | None]  # a run's profile.json, None where it has none
TOP = 10


@dataclass(frozen=True)
class Move:
    """A function's self time per call in the profile before a step and in the one after it (0 where absent)."""

    function: str
    before_s: float
    after_s: float

    @property
    def moved_s(self) -> float:
        return self.after_s - self.before_s


@dataclass(frozen=True)
class Diff:
    before: Entry  # the profiled run before the step
    after: Entry  # ... and from it on
    moves: list[Move]
    profiler: str = "cProfile"  # what made the profiles (torch.profiler for torch jobs)


def moves(before: dict, after: dict, top: int = TOP) -> list[Move]:
    """The `top` functions whose self time per call moved most between two profile.json summaries, largest first."""
    own = [{f["function"]: f["self_s"] for f in summary["functions"]} for summary in (before, after)]
    found = [Move(name, own[0].get(name, 0.0), own[1].get(name, 0.0)) for name in dict.fromkeys([*own[0], *own[1]])]
    return sorted(found, key=lambda m: -abs(m.moved_s))[:top]


def step_diff(history: History, step: Step, read: Reader) -> Diff | None:
    """The diff across `step`: the nearest profiled run before it and the nearest from it on; None where either side
    has none."""
    before = next(((e, p) for e in reversed(history.entries[: step.index]) if (p := read(e))), None)
    after = next(((e, p) for e in history.entries[step.index :] if (p := read(e))), None)
    if before is None or after is None:
        return None
    return Diff(before[0], after[0], moves(before[1], after[1]), str(after[1].get("profiler", "cProfile")))


def reader(uri: str) -> Reader:
    """Each run's profile.json: from its folder (a run read from one), else from its MLflow run in `uri`, each read
    once."""
    read: dict[str, dict | None] = {}

    def profile(entry: Entry) -> dict | None:
        if entry.run_id not in read:
            read[entry.run_id] = _from_folder(Path(entry.run_id)) if "/" in entry.run_id else _from_store(uri, entry)
        return read[entry.run_id]

    return profile


def _from_folder(run_dir: Path) -> dict | None:
    path = run_dir / PROFILE_SUMMARY
    return json.loads(path.read_text()) if path.is_file() else None


def _from_store(uri: str, entry: Entry) -> dict | None:
    if not uri:
        return None
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    if PROFILE_SUMMARY not in {a.path for a in client.list_artifacts(entry.run_id)}:
        return None
    with tempfile.TemporaryDirectory() as folder:
        try:
            return _from_folder(Path(client.download_artifacts(entry.run_id, PROFILE_SUMMARY, folder)).parent)
        except (MlflowException, OSError):
            return None

"""The one record of a run: `Result` alone reads and writes a run directory's result.json (and writes
its tensors.h5 and images/). Worker, launcher, tracking, reports and scripts all go through it.

result.json: {"format", "status", "config", "copied_keys", "metrics", "environment"} and, where they apply,
"identity" (its work, configuration, case and machine: runner.identity), "error", "warnings", "predictions"
(classifiers: per example the top-5 {"label", "probability"}) and "output_tail" (the last lines of a job that did
not finish). `status` is MLflow's word. "copied_keys": the flattened config keys written as a copy of another
({"model.image_size": "data.image_size"}), which the resolved config no longer shows; a file
recorded before the key existed reads as copying none.

Both files carry `format` (result.json's key, tensors.h5's root attribute): FORMAT when written. A file of a
later format than this code knows is refused with one line saying so; a file without one is of format 1,
the first (runs recorded before the key existed).
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

import numpy as np

from runner import identity
from runner.config import first_line
from runner.identity import Identity

RESULT_FILE = "result.json"
TENSORS_FILE = "tensors.h5"
IMAGES_DIR = "images"
LOG_FILE = "job.log"  # the worker's stdout and stderr
ERROR_LOG = "error.log"  # the traceback of a job that failed
PROFILE_FILE = "profile.pstats"  # timing.profile: cProfile's file of calls made after the timed ones
PROFILE_SUMMARY = "profile.json"  # ... and its functions by self time per call (runner.measure.profile)
PROFILE_TRACE = "profile.trace.json"  # ... torch.profiler's Chrome trace where the job ran on torch


class Status(StrEnum):
    """How a job ended, in MLflow's words (a run's status there): what result.json records."""

    FINISHED = "FINISHED"
    FAILED = "FAILED"
    KILLED = "KILLED"


STATUSES = tuple(Status)
FORMAT = 2  # of result.json and tensors.h5; raise it when a reader could misread the new layout
# 2: result.json holds the run's `identity` (runner.identity); a record of format 1 has it computed when read


class ResultUnreadable(ValueError):
    """A result.json that is missing or cannot be parsed; the message names the file."""


@dataclass
class Result:
    status: Status
    config: dict = field(default_factory=dict)  # the resolved run config
    metrics: dict = field(default_factory=dict)
    environment: dict = field(default_factory=dict)
    error: str | None = None
    warnings: list[str] = field(default_factory=list)
    predictions: list | None = None
    output_tail: str | None = None
    started: float | None = None  # wall-clock epoch seconds of the job's start and end (the MLflow run spans them)
    ended: float | None = None
    copied_keys: dict[str, str] = field(default_factory=dict)  # config key -> the key it copies
    recorded_identity: dict | None = None  # result.json's `identity` as read (format 2 on)
    # Kept in memory while the job runs, written beside result.json (tensors.h5, images/*.png):
    tensors: dict[str, np.ndarray] = field(default_factory=dict, repr=False)
    attrs: dict[str, Any] = field(default_factory=dict, repr=False)  # root attributes of tensors.h5
    images: np.ndarray | None = field(default=None, repr=False)  # NCHW in [-1, 1]
    stopped_by: str | None = field(default=None, repr=False)  # what stopped it in this process (job.StopReason)

    # -- result.json ------------------------------------------------------------------------------

    def to_dict(self) -> dict:
        record = {
            "format": FORMAT,
            "status": self.status,
            "config": self.config,
            "copied_keys": self.copied_keys,
            "metrics": self.metrics,
            "environment": self.environment,
        }
        found = self.identity()
        optional = {
            "identity": found.to_dict() if found else None,
            "error": self.error,
            "warnings": self.warnings or None,
            "predictions": self.predictions,
            "output_tail": self.output_tail,
            "started": self.started,
            "ended": self.ended,
        }
        record.update({k: v for k, v in optional.items() if v is not None})
        return record

    @classmethod
    def from_dict(cls, record: dict) -> Result:
        return cls(
            status=Status(record["status"]),
            config=record.get("config", {}),
            copied_keys=record.get("copied_keys", {}),
            metrics=record.get("metrics", {}),
            environment=record.get("environment", {}),
            error=record.get("error"),
            warnings=record.get("warnings", []),
            predictions=record.get("predictions"),
            output_tail=record.get("output_tail"),
            started=record.get("started"),
            ended=record.get("ended"),
            recorded_identity=record.get("identity"),
        )

    def identity(self) -> Identity | None:
        """The run's work, configuration, case and machine (runner.identity): as recorded, else computed from its
        config and environment; None for a job refused before it recorded either."""
        if self.recorded_identity:
            return Identity.from_dict(self.recorded_identity)
        if not (self.config and self.environment):
            return None
        from runner.record.naming import run_name

        return identity.of_config(self.config, self.copied_keys, self.environment, run_name(self.config))

    def save(self, run_dir: Path) -> Path:
        """Write result.json whole or not at all (a killed writer leaves the previous file). A symlink
        named result.json is replaced, never followed."""
        path = Path(run_dir) / RESULT_FILE
        text = json.dumps(self.to_dict(), indent=2, default=_json_default) + "\n"
        with _fresh_file(path) as temporary:
            temporary.write_text(text)
        return path

    @classmethod
    def load(cls, run_dir: Path) -> Result:
        path = Path(run_dir) / RESULT_FILE
        try:
            record = json.loads(path.read_text())
            check_format(record.get("format", 1), path)
            if record.get("status") not in STATUSES:
                raise ValueError(f"status {record.get('status')!r} is none of {', '.join(STATUSES)}")
            return cls.from_dict(record)
        except (OSError, ValueError, AttributeError) as error:
            raise ResultUnreadable(f"{path} cannot be read ({first_line(error)})") from None

    @staticmethod
    def exists(run_dir: Path) -> bool:
        return (Path(run_dir) / RESULT_FILE).is_file()

    # -- the whole run directory ------------------------------------------------------------------

    def write(self, run_dir: Path) -> None:
        """result.json, then tensors.h5 and images/ where there are any. Where the device fills (errno 28) or fails on
        the way, result.json is kept and says, in a warning, which file could not be written and why."""
        self.save(run_dir)
        name = IMAGES_DIR
        try:
            if self.images is not None:
                write_images(Path(run_dir) / IMAGES_DIR, self.images)
            name = TENSORS_FILE
            if self.tensors:
                attrs = {**self.attrs, "format": FORMAT, "environment": self.environment, "config": self.config}
                write_tensors(Path(run_dir) / TENSORS_FILE, self.tensors, attrs)
        except OSError as error:
            why = os.strerror(error.errno) if error.errno else first_line(error)
            self.warnings.append(f"{Path(run_dir) / name} could not be written ({why}): result.json keeps the rest")
            with contextlib.suppress(OSError):  # result.json as it was where even this cannot be written
                self.save(run_dir)


def check_format(found: object, path: Path) -> None:
    """ResultUnreadable unless `found` is a format this code reads (1 to FORMAT)."""
    if not (isinstance(found, int | np.integer) and 1 <= found <= FORMAT):
        raise ResultUnreadable(
            f"{path} is in format {found}, and this tensor-runner reads formats 1 to {FORMAT}: "
            "read it with the version that wrote it, or a newer one"
        )


def _open_tensors(path: Path):
    """tensors.h5 open for reading, its format checked (ResultUnreadable for a later one)."""
    import h5py

    f = h5py.File(path, "r")
    try:
        check_format(f.attrs.get("format", 1), path)
    except ResultUnreadable:
        f.close()
        raise
    return f


def write_tensors(path: Path, tensors: dict[str, np.ndarray], attrs: dict) -> Path:
    """tensors.h5: datasets at their paths ("inputs/x", "gradients/dense.weight", ...), root attrs
    (dicts and lists as JSON text); timings carry `units`, image batches `layout` (dataset_attrs)."""
    import h5py

    with _fresh_file(path) as temporary, h5py.File(temporary, "w") as f:
        for name, array in tensors.items():
            dataset = f.create_dataset(name, data=np.asarray(array))
            dataset.attrs.update(dataset_attrs(name, dataset.shape))
        for key, value in attrs.items():
            f.attrs[key] = value if isinstance(value, str | int | float) else json.dumps(value, default=str)
    return path


def dataset_attrs(name: str, shape: tuple[int, ...]) -> dict[str, str]:
    """What a reader needs to interpret one dataset: its unit, or the axis order of an image batch."""
    if name.startswith("timings/") and name.endswith("_s"):
        return {"units": "s"}
    is_image_batch = len(shape) == 4 and shape[1] in (1, 3) and name.split("/")[0] in ("inputs", "outputs")
    return {"layout": "NCHW"} if is_image_batch else {}


@contextmanager
def _fresh_file(path: Path) -> Iterator[Path]:
    """A new temporary file beside `path` (created here, so no link of anyone's is followed), moved onto
    `path` when the block ends: `path` is replaced whole, and a symlink at `path` is replaced, not followed."""
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with contextlib.suppress(FileNotFoundError):
        temporary.unlink()
    os.close(os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644))
    try:
        yield temporary
        os.replace(temporary, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            temporary.unlink()


def read_samples(run_dir: Path) -> np.ndarray | None:
    """The raw timing samples of a run (seconds per call), where its tensors.h5 is on this machine."""
    return read_timings(run_dir, "samples_s")


def read_timings(run_dir: Path, name: str) -> np.ndarray | None:
    """One per-sample series of tensors.h5 `timings/` (samples_s, sample_round, sample_end_unix_s, ...),
    where the file is on this machine and holds it."""
    path = Path(run_dir) / TENSORS_FILE
    if not path.exists():
        return None
    try:
        with _open_tensors(path) as f:
            return f[f"timings/{name}"][()] if f"timings/{name}" in f else None
    except OSError:
        return None


def read_inputs(run_dir: Path) -> dict[str, np.ndarray]:
    """The inputs a run computed on (tensors.h5 inputs/), where its file is on this machine."""
    path = Path(run_dir) / TENSORS_FILE
    if not path.exists():
        return {}
    try:
        with _open_tensors(path) as f:
            return {k: v[()] for k, v in f["inputs"].items()} if "inputs" in f else {}
    except OSError:
        return {}


def write_images(folder: Path, images: np.ndarray) -> None:
    """NCHW images in [-1, 1] (tanh outputs) -> PNG files, as a generator's output becomes a picture."""
    from PIL import Image

    folder.mkdir(parents=True, exist_ok=True)
    pixels = np.clip((images.astype(np.float64) + 1.0) / 2.0, 0.0, 1.0)
    for index, image in enumerate(pixels):
        Image.fromarray(np.round(image.transpose(1, 2, 0) * 255).astype(np.uint8)).save(folder / f"{index:03d}.png")


def _json_default(value: object) -> object:
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    return str(value)

"""A job's timing samples as one record, and the series recorded beside them.

Every sample is one timed block: its seconds per call (`samples_s`), the round it was taken in
(`sample_round`) and which of the job's worker processes took it (`sample_process`, from 0: timing.processes).
A `Series` adds one more value to every sample: when it ended, how busy the machine was, or a user's own. A new
series is a subclass of `Series` named under `timing.series` (the built-in ones are listed in conf/config.yaml;
`+timing.series.NAME=module.Class` adds one from the command line). Its values travel with the samples through a
sweep's interleaved rounds and reach tensors.h5 as `timings/NAME` (seconds where NAME ends in `_s`).
"""

from __future__ import annotations

import time
from collections.abc import Iterable

import numpy as np

from runner.config import ConfigError, class_named

SECONDS, ROUND, PROCESS = "samples_s", "sample_round", "sample_process"


def turn_typical(seconds: list[float] | np.ndarray, rounds: list[int] | np.ndarray | None) -> dict[int, float]:
    """Each round's typical time per call: the fastest sample of the job's turn in it (all samples are round 1
    where rounds were not recorded). A sample is slow when the job lost its core for part of the block (another
    process ran); never faster than the work. The fastest sample of a turn is the work itself, where the turn
    held one block that kept its core: BENCHMARKS.md, *Which estimator*, compares it with the median."""
    seconds = np.asarray(seconds, dtype=float)
    rounds = np.ones(len(seconds), dtype=int) if rounds is None else np.asarray(rounds)
    return {int(r): float(seconds[rounds == r].min()) for r in np.unique(rounds)}


def typical_s(seconds: list[float] | np.ndarray, rounds: list[int] | np.ndarray | None) -> float:
    """A job's typical time per call (`time_typical_s`): the median over its rounds of turn_typical (a turn in
    which the job shared its core throughout does not move it)."""
    return float(np.median(list(turn_typical(seconds, rounds).values())))


class Series:
    """One value per timing sample, read between timed blocks, never inside one. Override what you need."""

    def start(self) -> None:
        """A run of samples (a turn of the interleaved rounds, or the whole sampling) begins."""

    def before_block(self) -> None:
        """Just before a timed block."""

    def after_block(self, calls: int) -> float:
        """Just after a timed block of `calls` calls: the value of its sample."""
        return float("nan")

    def end(self, values: list) -> list:
        """The run of samples is over: its values, revised where the series knows better now."""
        return values

    def metrics(self, values: list) -> dict[str, float]:
        """What the job's record sums up from the series (metrics beside time_median_s). `values` is its column over
        all the job's samples: every process's, where the job was measured in several (timing.processes), where
        this object saw only this process's."""
        return {}


class SampleEnd(Series):
    """When each sample ended, in Unix seconds: MLflow's timestamps of the samples."""

    def after_block(self, calls: int) -> float:
        return time.time()


def build_series(paths: dict[str, str]) -> dict[str, Series]:
    """timing.series (name -> class path) -> one Series object per name."""
    series = {}
    for name, path in paths.items():
        if name in (SECONDS, ROUND, PROCESS):
            raise ConfigError(f"timing.series.{name}: {name} is the samples' own column; name the series otherwise")
        cls = class_named(f"timing.series.{name}", path)
        if not issubclass(cls, Series):
            raise ConfigError(f"timing.series.{name}={path} must be a subclass of runner.measure.samples.Series")
        series[name] = cls()
    return series


class Samples:
    """Columns of equal length: seconds per call, the round, the process, then one per series; a row per sample."""

    def __init__(self, columns: dict[str, list] | None = None):
        columns = {k: list(v) for k, v in (columns or {}).items()}
        seconds = columns.pop(SECONDS, [])
        rounds = columns.pop(ROUND, [1] * len(seconds))
        processes = columns.pop(PROCESS, [0] * len(seconds))
        self.columns: dict[str, list] = {SECONDS: seconds, ROUND: rounds, PROCESS: processes, **columns}

    def __len__(self) -> int:
        return len(self.columns[SECONDS])

    @property
    def seconds(self) -> list[float]:
        return self.columns[SECONDS]

    @property
    def rounds(self) -> list[int]:
        return self.columns[ROUND]

    @property
    def processes(self) -> list[int]:
        return self.columns[PROCESS]

    def add(self, seconds: float, round_: int, values: dict[str, float]) -> None:
        """One sample (taken in process 0: the coordinator renumbers another process's) and its series' values."""
        for name, value in {SECONDS: seconds, ROUND: round_, PROCESS: 0, **values}.items():
            self.columns.setdefault(name, []).append(value)

    def since(self, start: int) -> dict[str, list]:
        """The samples from the `start`-th on, column by column (a turn's, for the coordinator)."""
        return {name: values[start:] for name, values in self.columns.items()}

    def extend(self, columns: dict[str, list]) -> None:
        """Append samples given column by column (what `since` gave in a worker)."""
        for name, values in columns.items():
            self.columns.setdefault(name, []).extend(values)

    def revise(self, name: str, start: int, values: list) -> None:
        """Replace a series' values from the `start`-th sample on."""
        self.columns[name][start:] = values

    def tensors(self) -> dict[str, np.ndarray]:
        """tensors.h5 `timings/`: one dataset per column."""
        return {f"timings/{name}": np.asarray(values) for name, values in self.columns.items()}


def rel_iqr(samples: Iterable[float]) -> float:
    """IQR over median of the samples (numpy's linear percentiles); inf where the median is 0."""
    return ordered_rel_iqr(sorted(samples))


def ordered_rel_iqr(ordered: list[float]) -> float:
    """rel_iqr of samples already in ascending order, in plain Python: what the loop computes between blocks, where
    numpy's percentile cost TensorFlow's eager step 2.5% of its time (BENCHMARKS.md, parity process to process)."""

    def percentile(q: float) -> float:  # numpy's default (linear) interpolation
        position = (len(ordered) - 1) * q
        low = int(position)
        high = min(low + 1, len(ordered) - 1)
        return ordered[low] + (ordered[high] - ordered[low]) * (position - low)

    median = percentile(0.5)
    return float((percentile(0.75) - percentile(0.25)) / median) if median > 0 else float("inf")

"""A per-sample series for tests: the process's CPU seconds per call beside each sample's wall seconds.

It shows what a new per-sample series takes: this class, and its name under timing.series
(`+timing.series.sample_cpu_s=cpu_time_series.CpuTimePerCall` on the command line, or a line in a config).
CPU over wall time tells how many cores a step kept busy.
"""

from __future__ import annotations

import time

import numpy as np

from runner.measure.samples import Series


class CpuTimePerCall(Series):
    def __init__(self):
        self.started = 0.0

    def before_block(self) -> None:
        self.started = time.process_time()

    def after_block(self, calls: int) -> float:
        return (time.process_time() - self.started) / calls

    def metrics(self, values: list) -> dict[str, float]:
        return {"cpu_s_per_call_median": float(np.median(values))} if values else {}

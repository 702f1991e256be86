"""A workload whose time is known: each call waits `ms` milliseconds (time.sleep) and hands its input back.

A history test on a real machine needs a step it can find every time: a computed workload's time moves with the
machine's load and drift (a whole sweep 8-17% faster on this VM), a wait does not. RUNNER_TEST_EXTRA_WORK (a fraction,
e.g. 0.1) lengthens the wait by that share, its config unchanged: the same case, one point further along its history.
RUNNER_TEST_FIRST_CALL_S (seconds, e.g. 0.3) lengthens only the first call of a workload by that much, as a compiler
that takes longer to compile leaves the steady state alone.
"""

from __future__ import annotations

import os
import time

import numpy as np
from chain_model import extra_work

from runner.models import Workload

FIRST_CALL_S = "RUNNER_TEST_FIRST_CALL_S"


class PauseModel(Workload):
    name = "pause"
    gradients = per_example_gradients = jacobian = None

    def __init__(self, ms: float = 2.0, features: int = 4):
        self.seconds = ms / 1000 * (1 + extra_work())
        self.features = features
        self.first_call_extra_s = float(os.environ.get(FIRST_CALL_S) or 0.0)

    def init_params(self, rng: np.random.Generator) -> dict[str, np.ndarray]:
        return {}

    def make_inputs(self, rng: np.random.Generator, batch_size: int) -> dict[str, np.ndarray]:
        return {"x": rng.standard_normal((batch_size, self.features))}

    def examples_per_call(self, batch_size: int) -> int:
        return batch_size

    def forward(self, ops, params: dict, x):
        time.sleep(self.seconds + self.first_call_extra_s)
        self.first_call_extra_s = 0.0
        return x

"""A workload for history tests: x through `layers` dense layers of one weight, h = relu(h @ w.T).

Its work can grow without its config changing, as a library upgrade changes a model's work unseen: the
environment variable RUNNER_TEST_EXTRA_WORK (a fraction, e.g. 0.1) adds that share of layers (10 layers, 0.1: 11).
The case key (runner.identity.case) comes from the config, so a run with the extra work is the same case, one
point further along its history: benchmarks/history_real.py slows it from a chosen sweep on.

Its numbers can change the same way: RUNNER_TEST_OFFSET (e.g. 100) adds that constant to every layer's output and
takes it away again, which float64 keeps and float32 rounds to the constant's precision (at 100, 64 features, batch
8: its error against the float64 reference grows from 1.9e-7 to 1.6e-6, within the tolerance), as an upgrade that
computes less carefully would.
"""

from __future__ import annotations

import os

import numpy as np

from runner.models import Workload

EXTRA_WORK = "RUNNER_TEST_EXTRA_WORK"
OFFSET = "RUNNER_TEST_OFFSET"


def extra_work() -> float:
    """The share of extra work asked for by RUNNER_TEST_EXTRA_WORK (0 where it is unset or empty)."""
    return _number(EXTRA_WORK)


def offset() -> float:
    """The constant of RUNNER_TEST_OFFSET (0 where it is unset or empty)."""
    return _number(OFFSET)


def _number(variable: str) -> float:
    text = os.environ.get(variable, "").strip()
    return float(text) if text else 0.0


class ChainModel(Workload):
    name = "chain"
    gradients = per_example_gradients = jacobian = None

    def __init__(self, features: int = 128, layers: int = 10):
        self.features = features
        self.layers = max(1, round(layers * (1 + extra_work())))  # the layers it runs: its config's, plus the extra
        self.offset = offset()

    def init_params(self, rng: np.random.Generator) -> dict[str, np.ndarray]:
        # He's scale: relu halves the variance, the weight doubles it, so h keeps its size through the layers
        return {"w": rng.standard_normal((self.features, self.features)) * np.sqrt(2.0 / self.features)}

    def make_inputs(self, rng: np.random.Generator, batch_size: int) -> dict[str, np.ndarray]:
        return {"x": rng.standard_normal((batch_size, self.features))}

    def examples_per_call(self, batch_size: int) -> int:
        return batch_size

    def forward(self, ops, params: dict, x):
        h = x
        for _ in range(self.layers):
            h = ops.relu(ops.linear(h, params["w"]))
            h = (h + self.offset) - self.offset if self.offset else h
        return h

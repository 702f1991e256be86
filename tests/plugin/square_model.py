"""A workload for tests: y = (x @ w.T)^2, loss = sum(y), with its float64 numpy gradient.

It shows what a new model takes: this class and conf/model/square.yaml.
"""

from __future__ import annotations

import numpy as np

from runner.models import Workload


class SquareModel(Workload):
    name = "square"
    per_example_gradients = jacobian = None

    def __init__(self, features: int):
        self.features = features

    def init_params(self, rng: np.random.Generator) -> dict[str, np.ndarray]:
        return {"w": rng.standard_normal((1, self.features))}

    def make_inputs(self, rng: np.random.Generator, batch_size: int) -> dict[str, np.ndarray]:
        return {"x": rng.standard_normal((batch_size, self.features)), "labels": np.zeros((batch_size, 1))}

    def examples_per_call(self, batch_size: int) -> int:
        return batch_size

    def forward(self, ops, params: dict, x):
        return ops.square(ops.linear(x, params["w"]))

    def loss(self, ops, params: dict, x, labels):
        return ops.sum(self.forward(ops, params, x))

    def gradients(self, params: dict, x: np.ndarray, labels: np.ndarray) -> dict[str, np.ndarray]:
        """d/dw sum((x w^T)^2) = 2 (x w^T)^T x."""
        return {"w": 2 * (x @ params["w"].T).T @ x}

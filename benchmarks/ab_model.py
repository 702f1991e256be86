"""The A/B workload: two methods whose work differs by a known 10%, for testing comparisons (BENCHMARKS.md).

`method=a` multiplies a batch by one n x n matrix `layers` times; `method=b` does `layers // 10` more of the
same multiplications (11 against 10 by default), so b's time is about 1.10x a's, the call's fixed cost aside.
The matrix is symmetric, so every backend's weight layout multiplies by the same matrix.
"""

from __future__ import annotations

import numpy as np

from runner.config import ConfigError, require_positive
from runner.models import Workload


class ChainAB(Workload):
    name = "ab"
    gradients = per_example_gradients = jacobian = None

    def __init__(self, n: int, layers: int, method: str):
        require_positive(n=n, layers=layers)
        if method not in ("a", "b"):
            raise ConfigError(f"model.method={method}: must be a or b")
        self.n, self.method = n, method
        self.steps = layers if method == "a" else layers + layers // 10

    def init_params(self, rng: np.random.Generator) -> dict[str, np.ndarray]:
        m = rng.standard_normal((self.n, self.n))
        return {"w": (m + m.T) / (2 * np.sqrt(self.n))}  # symmetric: the layout does not matter; norms stay put

    def make_inputs(self, rng: np.random.Generator, batch_size: int) -> dict[str, np.ndarray]:
        return {"x": rng.standard_normal((batch_size, self.n))}

    def examples_per_call(self, batch_size: int) -> int:
        return batch_size

    def forward(self, ops, params: dict, x):
        for _ in range(self.steps):
            x = ops.matmul(x, params["w"])
        return x

"""Seed 003's model: dense (in -> hidden, with bias) -> relu -> linear (hidden -> out, no bias).

Loss: sum of squared error against labels. Parameter names and shapes follow a torch module

    dense = nn.Linear(in_features, hidden); proj = nn.Linear(hidden, out_features, bias=False)

so `dense.weight` is (hidden, in) and y = relu(x @ dense.weight.T + dense.bias) @ proj.weight.T.
"""

from __future__ import annotations

import numpy as np

from runner.config import require_positive
from runner.models import ForwardSize, Workload


class MLP(Workload):
    name = "mlp"

    def __init__(self, in_features: int = 32, hidden: int = 64, out_features: int = 2):
        require_positive(in_features=in_features, hidden=hidden, out_features=out_features)
        self.in_features, self.hidden, self.out_features = in_features, hidden, out_features

    def init_params(self, rng: np.random.Generator) -> dict[str, np.ndarray]:
        """Initialised as the guide does: w1 ~ N(0,1)/sqrt(in), bias ~ N(0,1), w2 ~ N(0,1)/8."""
        w1 = rng.standard_normal((self.in_features, self.hidden)) / np.sqrt(self.in_features)
        bias = rng.standard_normal(self.hidden)
        w2 = rng.standard_normal((self.hidden, self.out_features)) / 8
        return {"dense.weight": w1.T.copy(), "dense.bias": bias, "proj.weight": w2.T.copy()}

    def make_inputs(self, rng: np.random.Generator, batch_size: int) -> dict[str, np.ndarray]:
        return {
            "x": rng.standard_normal((batch_size, self.in_features)),
            "labels": rng.standard_normal((batch_size, self.out_features)),
        }

    def examples_per_call(self, batch_size: int) -> int:
        return batch_size

    def forward_size(self, batch_size: int) -> ForwardSize:
        return ForwardSize(
            weights=self.hidden * (self.in_features + 1) + self.out_features * self.hidden,
            inputs=batch_size * (self.in_features + self.out_features),
            outputs=batch_size * self.out_features,
            examples=batch_size,
            x_per_example=self.in_features,
            flops=2.0 * batch_size * self.hidden * (self.in_features + self.out_features),
        )

    # -- written once, run on every backend's ops --------------------------------------------

    def forward(self, ops, params: dict, x):
        hidden = ops.relu(ops.linear(x, params["dense.weight"], params["dense.bias"]))
        return ops.linear(hidden, params["proj.weight"])

    def loss(self, ops, params: dict, x, labels):
        return ops.sum(ops.square(self.forward(ops, params, x) - labels))

    # -- explicit backprop in numpy: numpy's gradients and the float64 reference ---------------

    def _activations(self, params: dict, x: np.ndarray):
        pre = x @ params["dense.weight"].T + params["dense.bias"]
        hidden = np.maximum(pre, 0)
        return pre, hidden, hidden @ params["proj.weight"].T

    def _backprop(self, params: dict, x: np.ndarray, labels: np.ndarray):
        pre, hidden, y = self._activations(params, x)
        d_y = 2 * (y - labels)  # d loss / d y, (batch, out)
        d_pre = (d_y @ params["proj.weight"]) * (pre > 0)  # (batch, hidden)
        return hidden, d_y, d_pre

    def gradients(self, params: dict, x: np.ndarray, labels: np.ndarray) -> dict[str, np.ndarray]:
        hidden, d_y, d_pre = self._backprop(params, x, labels)
        return {"dense.weight": d_pre.T @ x, "dense.bias": d_pre.sum(0), "proj.weight": d_y.T @ hidden}

    def per_example_gradients(self, params: dict, x: np.ndarray, labels: np.ndarray) -> dict[str, np.ndarray]:
        hidden, d_y, d_pre = self._backprop(params, x, labels)
        return {
            "dense.weight": np.einsum("bh,bi->bhi", d_pre, x),
            "dense.bias": d_pre,
            "proj.weight": np.einsum("bo,bh->boh", d_y, hidden),
        }

    def jacobian(self, params: dict, x: np.ndarray) -> np.ndarray:
        """d y_b / d x_b for each example: proj.weight @ diag(relu'(pre_b)) @ dense.weight."""
        pre = x @ params["dense.weight"].T + params["dense.bias"]
        return np.einsum("oh,bh,hi->boi", params["proj.weight"], (pre > 0).astype(x.dtype), params["dense.weight"])

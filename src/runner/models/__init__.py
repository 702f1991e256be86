"""Workloads: one weight spec each, written once against a backend's ops.

A workload provides
  init_params(rng) -> {torch state-dict name: float64 array}   (torch names and shapes on every backend)
  make_inputs(rng, batch_size) -> {"x": ..., and "labels" where the loss uses them}
  forward(ops, params, x) and loss(ops, params, x, labels), written with the backend's ops
  examples_per_call(batch_size) -> int (for throughput)
and, as plain float64 numpy (the reference every run is checked against, and numpy's backprop):
  gradients(params, x, labels), per_example_gradients(params, x, labels), jacobian(params, x)
  (None where the workload defines no such derivative).
"""

from __future__ import annotations

from omegaconf import DictConfig

from runner.models.mlp import MLP
from runner.models.op_workloads import Matmul, Sigmoid


def build_workload(model_cfg: DictConfig):
    """The workload object for `model.name`, sized by the rest of the model config."""
    name = str(getattr(model_cfg.name, "value", model_cfg.name))
    if name == "mlp":
        return MLP(model_cfg.in_features, model_cfg.hidden, model_cfg.out_features)
    if name == "matmul":
        return Matmul(model_cfg.n)
    if name == "sigmoid":
        return Sigmoid(model_cfg.size)
    raise ValueError(f"unknown model {name!r}")

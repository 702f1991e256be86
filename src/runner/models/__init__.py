"""Workloads: one weight spec each, written once against a backend's ops.

A workload provides
  init_params(rng) -> {torch state-dict name: float64 array}   (torch names and shapes on every backend)
  make_inputs(rng, batch_size) -> {"x": ..., and "labels" where the loss uses them}
  forward(ops, params, x) and loss(ops, params, x, labels), written with the backend's ops
  examples_per_call(batch_size) -> int (for throughput)
  trainable(name) -> bool (optional; without it every parameter is trained)
  host_params (optional): names of parameters kept as numpy arrays instead of placed on the backend
  extra_metrics(ops, params, inputs, output) -> dict (optional): workload-specific metrics
and, as plain float64 numpy (the reference every run is checked against, and numpy's backprop):
  gradients(params, x, labels), per_example_gradients(params, x, labels), jacobian(params, x)
  (None where the workload defines no such derivative).
"""

from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig

from runner.config import ConfigError
from runner.models.mlp import MLP
from runner.models.op_workloads import Conversion, Matmul, Reshape, Sigmoid
from runner.models.vision import RESNET_LAYERS, VisionModel


def build_workload(model_cfg: DictConfig, image_size: int = 224):
    """The workload object for `model.name`, sized by the rest of the model config."""
    name = str(getattr(model_cfg.name, "value", model_cfg.name))
    if name in RESNET_LAYERS or name in ("alexnet", "cyclegan"):
        return VisionModel(name, image_size)
    if name == "mlp":
        return MLP(model_cfg.in_features, model_cfg.hidden, model_cfg.out_features)
    if name == "matmul":
        return Matmul(model_cfg.n)
    if name == "sigmoid":
        return Sigmoid(model_cfg.size)
    if name == "conversion":
        return Conversion(model_cfg.size, model_cfg.method)
    if name == "reshape":
        return Reshape(model_cfg.n, model_cfg.method)
    raise ValueError(f"unknown model {name!r}")


def initial_weights(model_cfg: DictConfig, workload, rng):
    """Seeded weights, or the file named by model.weights / torchvision's file when model.pretrained."""
    from runner.models.weights import match_spec, pretrained_path, read_checkpoint

    seeded = workload.init_params(rng)  # drawn even when replaced, so inputs stay the same for a seed
    if model_cfg.weights:
        path = Path(model_cfg.weights).expanduser()
    elif model_cfg.pretrained:
        path = pretrained_path(str(getattr(model_cfg.name, "value", model_cfg.name)))
        if not path.is_file():
            raise ConfigError(
                f"model.pretrained=true: {path.name} is not in the torch hub cache ({path.parent}); "
                "nothing is downloaded at run time: put the file there or set TORCH_HOME"
            )
    else:
        return seeded
    return match_spec(read_checkpoint(path), workload.spec, path)

"""Workloads: what is timed. A workload is a class named by `_target_` in conf/model/NAME.yaml.

Its constructor takes the model config's other keys (`name`, `supports`, `pretrained` and `weights`
excepted), typed with annotations: `check_combination` checks the config against them. It is written
once against the backend ops (`runner.backends`) and runs on every backend that has the op families
its yaml lists under `supports.ops`. See `Workload` for the methods; a user's own workload lives in
their own package and config folder (README: *Bring your own model*).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import numpy as np
from omegaconf import DictConfig

from runner.config import ConfigError, workload_arguments

Params = dict[str, np.ndarray]


class Workload(Protocol):
    """What the runner needs of a workload. Parameters use ONE naming and layout on every backend
    (torch state-dict names and shapes); arrays are float64 numpy until a backend places them."""

    name: str
    # float64 numpy derivatives, the reference every run is checked against (and numpy's backprop);
    # None where the workload defines no such derivative.
    gradients: Callable[[Params, np.ndarray, np.ndarray], Params] | None
    per_example_gradients: Callable[[Params, np.ndarray, np.ndarray], Params] | None
    jacobian: Callable[[Params, np.ndarray], np.ndarray] | None

    def init_params(self, rng: np.random.Generator) -> Params: ...

    def make_inputs(self, rng: np.random.Generator, batch_size: int) -> dict[str, np.ndarray]:
        """{"x": ...} and "labels" where the loss uses them."""

    def examples_per_call(self, batch_size: int) -> int: ...

    def forward(self, ops: Any, params: dict, x: Any) -> Any:
        """The model on backend `ops` (a backend module), with native arrays."""


class OptionalWorkloadParts(Protocol):
    """Methods and attributes a workload MAY define; the runner checks for each with getattr."""

    spec: dict[str, tuple]  # {name: shape} of loadable weights: model.weights / model.pretrained work
    host_params: tuple[str, ...]  # parameters kept as numpy arrays instead of placed on the backend
    numpy_reference: bool  # False: no float64 numpy forward to check against
    own_layout: bool  # True: parameters keep the workload's layout on every backend (Keras's), never converted
    makes_images: bool  # data=image/tfrecord/hdf5: outputs are images (no centre crop), not class scores

    def pretrained_path(self) -> Path:
        """Where model.pretrained=true finds this model's published weights (default: torchvision's file for `name`)."""

    def read_weights(self, path: Path) -> Params:
        """model.weights=FILE read by the workload itself (a Keras .weights.h5) instead of the runner's readers."""

    def preprocess(self, image: Any) -> np.ndarray:
        """A PIL RGB image -> float64 CHW, the model's own preprocessing (instead of seed 004's)."""

    def make_labels(self, rng: np.random.Generator, x: np.ndarray) -> np.ndarray:
        """Seeded targets for images read from files (data=image/tfrecord/hdf5)."""

    def loss(self, ops: Any, params: dict, x: Any, labels: Any) -> Any: ...

    def trainable(self, name: str) -> bool:
        """False for constants such as batch-norm statistics (default: every parameter is trained)."""

    def extra_metrics(self, ops: Any, params: dict, inputs: dict, output: Any) -> dict[str, float]: ...

    def flops_per_call(self) -> float: ...

    def interpret(self, y: np.ndarray) -> dict:
        """What a person reads of the outputs: {"predictions": per example top-5} or {"images": NCHW}."""


def build_workload(model_cfg: DictConfig) -> Workload:
    """The workload object that `model._target_` names, built from the rest of the model config."""
    from hydra.utils import get_class

    return get_class(model_cfg._target_)(**workload_arguments(model_cfg))


def initial_weights(model_cfg: DictConfig, workload: Workload, rng: np.random.Generator) -> Params:
    """Seeded weights, or the file named by model.weights / torchvision's file when model.pretrained."""
    from runner.models.weights import match_spec, pretrained_path, read_checkpoint

    seeded = workload.init_params(rng)  # drawn even when replaced, so inputs stay the same for a seed
    if model_cfg.get("weights") and hasattr(workload, "read_weights"):
        return workload.read_weights(Path(model_cfg.weights).expanduser())
    if model_cfg.get("weights"):
        path = Path(model_cfg.weights).expanduser()
    elif model_cfg.get("pretrained"):
        path = workload.pretrained_path() if hasattr(workload, "pretrained_path") else pretrained_path(workload.name)
        if not path.is_file():
            raise ConfigError(
                f"model.pretrained=true: {path.name} is not in the torch hub cache ({path.parent}); "
                "nothing is downloaded at run time: put the file there or set TORCH_HOME"
            )
    else:
        return seeded
    return match_spec(read_checkpoint(path), workload.spec, path)


def backend_for(workload: Workload, backend: Any) -> Any:
    """The backend as the runner uses it for this workload: with `own_layout`, weights and gradients keep
    the workload's layout (no to/from_native_layout), everything else is the backend's."""
    return _OwnLayout(backend) if getattr(workload, "own_layout", False) else backend


class _OwnLayout:
    def __init__(self, backend: Any):
        self._backend = backend

    def __getattr__(self, name: str) -> Any:
        return getattr(self._backend, name)

    @staticmethod
    def to_native_layout(array: np.ndarray) -> np.ndarray:
        return array

    @staticmethod
    def from_native_layout(array: np.ndarray, per_example: bool = False) -> np.ndarray:
        return array

"""Workloads: what is timed. `model=NAME` on the command line picks conf/model/NAME.yaml, whose `_target_`
names a `Workload` subclass: a network or an op workload (matmul, sigmoid), hence the name in code.

Its constructor takes the model config's other keys (`name`, `supports`, `pretrained` and `weights`
excepted), typed with annotations: `check_combination` checks the config against them. It is written
once against the backend ops (`runner.backends`) and runs on every backend that has the op families
its yaml lists under `supports.ops`. See `Workload` for the methods; a user's own workload lives in
their own package and config folder (README: *Bring your own model*).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np

from runner.config import ConfigError, class_named, workload_arguments

Params = dict[str, np.ndarray]


@dataclass(frozen=True)
class ForwardSize:
    """One forward call on a batch, in elements and FLOPs: what the tasks (runner.tasks) scale to their own calls."""

    weights: int
    inputs: int  # the call's inputs and labels
    outputs: int
    examples: int
    x_per_example: int  # one example's input elements: the columns of its jacobian
    flops: float | None = None
    layer_activations: int = 0  # what one layer holds while it runs; 0: not counted (it depends on the framework)
    layers: int = 1


class Workload:
    """What every workload is: subclass it and define the four methods without defaults; the rest have
    defaults a workload overrides where it differs. Parameters use ONE naming and layout on every backend
    (torch state-dict names and shapes); arrays are float64 numpy until a backend places them."""

    name: str
    # float64 numpy derivatives, the reference every run is checked against (and numpy's backprop);
    # None where the workload defines no such derivative.
    gradients: Callable[[Params, np.ndarray, np.ndarray], Params] | None = None
    per_example_gradients: Callable[[Params, np.ndarray, np.ndarray], Params] | None = None
    jacobian: Callable[[Params, np.ndarray], np.ndarray] | None = None
    loss: Callable[..., Any] | None = None  # loss(ops, params, x, labels); op workloads have none
    preprocess: Callable[[Any], np.ndarray] | None = None  # a PIL RGB image -> float64 CHW, its own (not seed 004's)
    spec: dict[str, tuple] | None = None  # {name: shape} of loadable weights: model.weights / model.pretrained
    host_params: tuple[str, ...] = ()  # parameters kept as numpy arrays instead of placed on the backend
    numpy_reference: bool = True  # False: no float64 numpy forward to check against
    own_layout: bool = False  # True: parameters keep the workload's layout on every backend (Keras's)
    own_precision: bool = False  # True: the workload applies precision= itself (Keras's dtype policy)
    makes_images: bool = False  # data=image/tfrecord/hdf5: outputs are images (no centre crop), not class scores
    # its constructor imports no framework: preflight builds it to check its settings before any framework loads
    builds_without_framework: bool = True
    # task=train_step through the workload's own training API instead of the backend's (model=keras: Keras's
    # train_on_batch), with Backend.train_step's arguments and result and its OPTIMIZER_CONVENTION beside it
    train_step: Callable[..., tuple[Callable, Callable[[], dict]]] | None = None
    OPTIMIZER_CONVENTION = "torch"  # with train_step: whose formulas its optimizer follows, as a backend declares
    # task=generate through the workload's own generation API (keras_hub's generate()): generate(backend, params,
    # prompt, new_tokens) -> the new tokens (batch, new_tokens) in numpy; its tokens are timed as a whole
    generate: Callable[[Any, dict, Any, int], np.ndarray] | None = None

    @property
    def TRAIN_STEP_COMPILED(self) -> dict[str, str]:  # noqa: N802 - the name backend modules give it
        """With train_step: mode -> how its step is compiled in that mode, as a backend declares; {}: nothing said."""
        return {}

    def init_params(self, rng: np.random.Generator) -> Params:
        raise NotImplementedError

    def make_inputs(self, rng: np.random.Generator, batch_size: int) -> dict[str, np.ndarray]:
        """{"x": ...} and "labels" where the loss uses them."""
        raise NotImplementedError

    def examples_per_call(self, batch_size: int) -> int:
        raise NotImplementedError

    def forward(self, ops: Any, params: dict, x: Any) -> Any:
        """The model on backend `ops` (a backend module), with native arrays."""
        raise NotImplementedError

    def pretrained_path(self) -> Path:
        """Where model.pretrained=true finds this model's published weights: torchvision's file for `name`."""
        from runner.models.weights import pretrained_path

        return pretrained_path(self.name)

    def read_weights(self, path: Path) -> Params | None:
        """model.weights=FILE read by the workload itself (a Keras .weights.h5); None: the runner's readers."""
        return None

    def make_labels(self, rng: np.random.Generator, x: np.ndarray) -> np.ndarray | None:
        """Seeded targets for images read from files (data=image/tfrecord/hdf5); None: it takes no images."""
        return None

    def check_images(self, x: np.ndarray, source: str) -> None:
        """Refuse (ConfigError) images the network cannot take, before any timed call."""

    def trainable(self, name: str) -> bool:
        """False for constants such as batch-norm statistics."""
        return True

    def extra_metrics(self, ops: Any, params: dict, inputs: dict, output: Any) -> dict[str, float]:
        return {}

    def describe(self, ops: Any, params: dict, inputs: dict, backward: bool) -> dict[str, str]:
        """What ran, in words, for result.json's environment (e.g. the attention kernel a framework picked, for a
        call that differentiates the model where `backward`)."""
        return {}

    def flops_per_call(self) -> float | None:
        return None

    def forward_size(self, batch_size: int) -> ForwardSize | None:
        """One forward call's elements and FLOPs, which each task scales to its own call for the memory check and
        the cost note (runner.measure.limits); None: not checked."""
        return None

    def size_setting(self, batch_size: int) -> str:
        """The settings that set this workload's size, as a refusal names them: 'model.n=4096'."""
        return f"batch_size={batch_size}"

    def own_reference(self, request: dict[str, Any], params: dict, inputs: dict) -> dict[str, np.ndarray] | None:
        """The task's float64 results computed by the workload itself, or None: the task computes them in numpy.
        `request["results"]` says which, by the results' tensors.h5 path: "outputs/y", "outputs/jacobian",
        "gradients" (with "per_example") or "trained" (with "optimizer" and "steps"). model=keras runs the same model
        in float64 on Keras's TensorFlow backend."""
        return None

    def run_warnings(self) -> list[str]:
        """What the run should be told once it is over, beside the task's own warnings."""
        return []

    def interpret(self, y: np.ndarray) -> dict:
        """What a person reads of the outputs: {"predictions": per example top-5} or {"images": NCHW}."""
        return {}


def build_workload(model: Mapping[str, Any]) -> Workload:
    """The workload object that `model._target_` names, built from the rest of the model's settings."""
    cls = class_named("model._target_", model["_target_"])
    if not (isinstance(cls, type) and issubclass(cls, Workload)):
        raise ConfigError(f"model._target_={model['_target_']} must be a subclass of runner.models.Workload")
    return cls(**workload_arguments(model))


def check_known_wrong(model: Mapping[str, Any], choices: dict[str, str]) -> None:
    """Refuse (ConfigError, one line) a combination the model's yaml lists under `supports.known_wrong`: one that
    runs but computes wrong numbers, refused with the reason. Each entry names axis values (a value or a list) and
    `why`; it matches when every named axis matches."""
    for entry in (model.get("supports") or {}).get("known_wrong") or []:
        axes = {axis: value for axis, value in entry.items() if axis != "why"}
        if all(
            choices[axis] in (value if isinstance(value, Sequence) and not isinstance(value, str) else [value])
            for axis, value in axes.items()
        ):
            setting = " ".join(f"{axis}={choices[axis]}" for axis in axes)
            raise ConfigError(f"model={choices['model']} with {setting} is refused: {entry['why']}")


def initial_weights(model: Mapping[str, Any], workload: Workload, rng: np.random.Generator) -> Params:
    """Seeded weights, or the checkpoint named by model.weights (a file, or a Hugging Face folder: models.checkpoints) /
    torchvision's file when model.pretrained."""
    from runner.models.checkpoints import match_spec, read

    seeded = workload.init_params(rng)  # drawn even when replaced, so inputs stay the same for a seed
    own = workload.read_weights(Path(model["weights"]).expanduser()) if model.get("weights") else None
    if own is not None:
        return own
    if model.get("weights"):
        path = Path(model["weights"]).expanduser()
    elif model.get("pretrained"):
        path = workload.pretrained_path()
        if not path.is_file():
            raise ConfigError(
                f"model.pretrained=true: {path.name} is not in the torch hub cache ({path.parent}); "
                "nothing is downloaded at run time: put the file there or set TORCH_HOME"
            )
    else:
        return seeded
    if workload.spec is None:  # an op workload or a model of one's own that names no loadable weights
        raise ConfigError(f"model={workload.name} takes no weights file: it has no `spec` of its weights")
    checkpoint = read(path)
    return match_spec(checkpoint.floats(), workload.spec, checkpoint.weights_file)


def backend_for(workload: Workload, backend: Any) -> Any:
    """The backend as the runner uses it for this workload: with `own_layout`, weights and gradients keep
    the workload's layout (no to/from_native_layout), everything else is the backend's."""
    if not workload.own_layout:
        return backend
    return SimpleNamespace(**{**vars(backend), "to_native_layout": _same, "from_native_layout": _same})


def _same(array: np.ndarray, per_example: bool = False) -> np.ndarray:
    return array

"""Any `keras.applications` model (`model=keras model.arch=NAME`) through Keras 3 on TensorFlow, torch or JAX.

Keras runs on the backend the run chose: the backend module's `KERAS_BACKEND` (op family `keras`) is set
as the environment variable before Keras is imported, which a fresh worker process allows
(`isolation=process`, the default). The model is called with `stateless_call`, so its weights are the
runner's parameters: gradients (GradientTape / torch.func), `tf.function`, `jit_compile` and
`torch.compile` apply to it as to every workload.

Weights: seeded in numpy from the variables' names and shapes (Keras's own initialisers draw different
numbers on each backend; these are the same on both), or `model.weights=FILE.weights.h5` (Keras's own
file, read by Keras). Parameters are named by the variables' paths (`Conv1/kernel`) and keep Keras's
layouts (HWIO kernels, (in, out) dense kernels) on both backends (`own_layout`), so the tensors.h5 files
of a TensorFlow run and a torch run compare directly. Inputs are NCHW, like every image in the runner,
and are transposed to Keras's channels-last inside the model call.

The reference (`max_rel_err_vs_reference`): the same model, weights and inputs in float64 on Keras's TensorFlow
backend, computed in a subprocess (runner.models.keras_reference, `own_reference`). TensorFlow is the one
Keras backend that keeps float64: on torch and JAX `keras.backend.result_type` turns float64 into float32, so
BatchNormalization, `ops.mean` and (torch) `ops.matmul` round a float64 model to float32 there; a float64 run
on them says so (`describe`, `run_warnings`; docs/models.md has the numbers).

Nothing heavy is imported at module level: the combination rules import this class before any framework.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

import numpy as np

from runner.backends.optimizers import Optimizer, keras_optimizer
from runner.config import ConfigError
from runner.models import Workload
from runner.models.architectures import N_CLASSES
from runner.models.keras_apps import (
    DEFAULT_IMAGE_SIZE,
    REFERENCE_BACKEND,
    build_application,
    import_keras,
    variable_names,
)
from runner.models.vision import top5

KERAS_POLICIES = {"bf16_mixed": "mixed_bfloat16", "fp16_mixed": "mixed_float16"}  # precision= -> Keras's policy
# Where a float64 MobileNetV2 computes in float32 because keras.backend.result_type("float64", "float32") is float32
# on every Keras backend but TensorFlow (keras/src/backend/common/dtypes.py, BIT64_TO_BIT32_DTYPE; keras-team/keras
# #23704): measured layer by layer against TensorFlow in float64, each layer fed TensorFlow's float64 input (Keras
# 3.15.1). The other layers (Conv2D, DepthwiseConv2D, ReLU, Add, padding) agreed to 2.4e-15. Layers of other
# architectures may do the same: the warning names these where the model has them, and the mechanism always.
FLOAT32_INSIDE = {
    "torch": {
        "BatchNormalization": "BatchNormalization",
        "GlobalAveragePooling2D": "ops.mean (GlobalAveragePooling2D)",
        "Dense": "ops.matmul (Dense)",
    },
    "jax": {"BatchNormalization": "BatchNormalization", "GlobalAveragePooling2D": "ops.mean (GlobalAveragePooling2D)"},
}


class KerasModel(Workload):
    builds_without_framework = False  # Keras builds the model
    """A Keras application (weights=None, logits out), its variables exposed as the runner's parameters."""

    # No numpy implementation, but a float64 reference all the same: the same Keras model in float64 on TensorFlow,
    # in a subprocess (own_reference), which the tasks ask for before computing one in numpy.
    numpy_reference = True
    gradients = per_example_gradients = jacobian = None
    makes_images = False
    own_layout = True  # Keras's layouts on every backend: the runner converts nothing
    own_precision = True  # precision=bf16_mixed / fp16_mixed: Keras's own mixed dtype policy (KERAS_POLICIES)
    spec: dict[str, tuple]  # always: set in __init__

    def __init__(
        self,
        arch: str,
        backend_module: str,
        image_size: int = DEFAULT_IMAGE_SIZE,
        dtype: str = "float32",
        precision: str = "full",
    ):
        self.keras = import_keras(importlib.import_module(backend_module).KERAS_BACKEND)
        self.name, self.arch, self.image_size, self.dtype = arch, arch, image_size, str(dtype)
        self.keras.config.set_floatx(str(dtype))  # variables and computation in the run's dtype
        self.mixed = precision in KERAS_POLICIES  # float32 variables, computation in the policy's dtype
        self.keras.config.set_dtype_policy(KERAS_POLICIES.get(precision, str(dtype)))  # process-wide: set every time
        self.model = build_application(self.keras, arch, image_size)
        self._trainable_names, self._other_names = variable_names(self.model)
        variables = self.model.trainable_variables + self.model.non_trainable_variables
        self._variables = dict(zip(self._trainable_names + self._other_names, variables, strict=True))
        self.spec = {n: tuple(v.shape) for n, v in self._variables.items() if _is_float(v)}
        # Integer state (a Normalization layer's count) stays Keras's own: not a parameter.
        self._fixed = {n: v.value for n, v in self._variables.items() if not _is_float(v)}
        self._reference_failures: list[str] = []

    # -- parameters ----------------------------------------------------------------------------

    def init_params(self, rng: np.random.Generator) -> dict[str, np.ndarray]:
        """Drawn in numpy by role (kernels He-normal by fan-in, batch-norm statistics mild), so both backends
        start from the same numbers; any other float variable keeps Keras's value where that is a constant."""
        return {name: _draw(rng, name, self._variables[name]) for name in self.spec}

    def read_weights(self, path: Path) -> dict[str, np.ndarray]:
        """A Keras weights file (`model.save_weights`), read by Keras against this architecture."""
        if not Path(path).is_file():
            raise ConfigError(f"weights file not found: {path}")
        try:
            self.model.load_weights(str(path))
        except Exception as error:
            reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
            raise ConfigError(f"cannot load {path} into {self.arch}: {reason[:300]}") from None
        return {
            name: np.asarray(self.keras.ops.convert_to_numpy(self._variables[name].value), np.float64)
            for name in self.spec
        }

    def trainable(self, name: str) -> bool:
        return name in self._trainable_names

    # -- inputs ------------------------------------------------------------------------------------

    def make_inputs(self, rng: np.random.Generator, batch_size: int) -> dict[str, np.ndarray]:
        x = rng.standard_normal((batch_size, 3, self.image_size, self.image_size))
        return {"x": x, "labels": self.make_labels(rng, x)}

    def make_labels(self, rng: np.random.Generator, x: np.ndarray) -> np.ndarray:
        return rng.standard_normal((len(x), N_CLASSES)) * 0.1

    def preprocess(self, image) -> np.ndarray:
        """A PIL image -> float64 CHW: resized and centre-cropped to image_size, then the arch's own
        `preprocess_input` (scaling to [-1, 1], ImageNet normalisation or caffe's BGR means, as it says)."""
        from PIL import Image, ImageOps

        size = (self.image_size, self.image_size)
        pixels = np.asarray(ImageOps.fit(image, size, Image.Resampling.BILINEAR), dtype=np.float32)[None]
        return np.asarray(_preprocess_input(self.keras, self.arch)(pixels), np.float64)[0].transpose(2, 0, 1)

    def examples_per_call(self, batch_size: int) -> int:
        return batch_size

    # -- the model call ----------------------------------------------------------------------------

    def forward(self, ops, params: dict, x):
        trainable = [params[name] for name in self._trainable_names]
        others = [params[name] if name in params else self._fixed[name] for name in self._other_names]
        nhwc = self.keras.ops.transpose(x, (0, 2, 3, 1))
        y, _ = self.model.stateless_call(trainable, others, nhwc, training=False)
        return self.keras.ops.cast(y, "float32") if self.mixed else y  # the loss in float32, as Keras computes it

    def loss(self, ops, params: dict, x, labels):
        """Sum of squared error against seeded targets, as for the other classifiers."""
        return ops.sum(ops.square(self.forward(ops, params, x) - labels))

    # -- task=train_step: Keras's own training step -----------------------------------------------------------

    OPTIMIZER_CONVENTION = "keras"  # keras.optimizers on every Keras backend

    def train_step(self, loss, params: dict, optimizer: Optimizer, mode: str, device: str, numpy_backprop=None):
        """Training as Keras users train: model.compile(optimizer, "mean_squared_error"), model.train_on_batch. The
        loss is the runner's training loss (the mean of the squared errors, task=train_step's `loss`, which Keras's
        compiled loss stands in for); batch normalization runs as train_on_batch runs it, on the batch's statistics,
        its moving averages starting from Keras's initial values. A model of its own, built on the device, holds
        the runner's weights and carries them from call to call."""
        keras = self.keras
        with keras.device(_keras_device(keras, device)):
            model = build_application(keras, self.arch, self.image_size)
            for name, variable in zip(self._trainable_names, model.trainable_variables, strict=True):
                variable.assign(params[name])
            model.compile(
                keras_optimizer(keras, optimizer, keras.config.floatx()), "mean_squared_error", **self._compiled(mode)
            )

        def step(x, labels):
            with keras.device(_keras_device(keras, device)):
                return model.train_on_batch(keras.ops.transpose(x, (0, 2, 3, 1)), labels)

        return step, lambda: {n: v.value for n, v in zip(self._trainable_names, model.trainable_variables, strict=True)}

    def _compiled(self, mode: str) -> dict:
        if mode == "eager":
            return {"run_eagerly": True, "jit_compile": False}
        # TensorFlow: tf.function, with XLA for mode=xla; torch: torch.compile; JAX: jax.jit
        return {"jit_compile": mode == "xla" or self.keras.backend.backend() != "tensorflow"}

    @property
    def TRAIN_STEP_COMPILED(self) -> dict[str, str]:  # noqa: N802 - the name Backend modules give it
        how = {"tensorflow": "tf.function", "torch": "torch.compile", "jax": "jax.jit"}[self.keras.backend.backend()]
        modes = {"eager": "model.train_on_batch, run_eagerly=True"}
        for mode in ("function", "xla"):
            options = self._compiled(mode)
            modes[mode] = f"model.train_on_batch, jit_compile={options['jit_compile']} (Keras's {how} of its step)"
        if how == "torch.compile":  # seen on MobileNetV2: the compiled step ran slower than the eager one
            modes["function"] += "; dynamo recompiles Keras's shared per-layer frames, past its limit eagerly"
        return modes

    def interpret(self, y: np.ndarray) -> dict:
        return {"predictions": top5(y)}

    def describe(self, ops, params: dict, inputs: dict, backward: bool) -> dict[str, str]:
        described = {
            "keras_dtype_policy": self.keras.config.dtype_policy().name,
            "keras_reference": f"the same model in float64 on Keras's {REFERENCE_BACKEND} backend (a subprocess)",
        }
        if self.dtype == "float64":
            inside = self.float32_inside()
            described["keras_float64"] = f"float32 inside: {inside}" if inside else "float64 throughout"
        return described

    # -- float64 on this backend, and the reference -------------------------------------------------------------

    def float32_inside(self) -> str:
        """'' where Keras keeps float64 on this backend; else what computes in float32 there, and why, in words."""
        keras = self.keras
        kept = keras.backend.result_type("float64", "float32")
        if kept == "float64":
            return ""
        backend = keras.backend.backend()
        classes = {type(layer).__name__ for layer in self.model.layers}
        seen = [what for name, what in FLOAT32_INSIDE.get(backend, {}).items() if name in classes]
        return (
            f"{', '.join(seen) if seen else 'the ops that promote dtypes'} compute in float32 "
            f"(keras.backend.result_type('float64', 'float32') is {kept} on Keras's {backend} backend, "
            "keras-team/keras#23704)"
        )

    def run_warnings(self) -> list[str]:
        """What makes this run's numbers not what dtype= says, and a reference that could not be computed."""
        found = list(self._reference_failures)
        inside = self.float32_inside() if self.dtype == "float64" else ""
        if inside:
            found.append(
                f"dtype=float64 is float32 in part: {inside}; its results carry float32's error against the same "
                f"model in float64 on {REFERENCE_BACKEND} (max_rel_err_vs_reference), which training amplifies"
            )
        return found

    def own_reference(self, request: dict[str, Any], params: dict, inputs: dict) -> dict[str, np.ndarray] | None:
        """The task's results from the same model, weights (`params`: every float variable, as the run holds them)
        and inputs, in float64 on Keras's TensorFlow backend (runner.models.keras_reference). {} for a task it does
        not know, or where that failed (then `run_warnings` says why)."""
        from runner.models import keras_reference

        if request["results"] not in keras_reference.RESULTS:
            return {}
        request = {**request, "arch": self.arch, "image_size": self.image_size}
        results, failure = keras_reference.compute(request, params, inputs)
        if failure:
            self._reference_failures.append(failure)
        return results


# -- helpers -------------------------------------------------------------------------------------


def _keras_device(keras, device: str) -> str:
    """keras.device's name for the run's device. Not "cpu:0" on torch: Keras moves each new variable there, torch
    counts that a move from "cpu", and the moved copy is no leaf tensor, so no gradient would reach it."""
    if device == "cuda":
        return "gpu:0"
    return "cpu" if keras.backend.backend() == "torch" else "cpu:0"


def _preprocess_input(keras, arch: str):
    """The `preprocess_input` of the keras.applications module that defines `arch`."""
    for name in dir(keras.applications):
        module = getattr(keras.applications, name)
        if not name[:1].isupper() and hasattr(module, arch) and hasattr(module, "preprocess_input"):
            return module.preprocess_input
    raise ConfigError(f"keras.applications has no preprocess_input for {arch}")


def _is_float(variable) -> bool:
    return "float" in str(variable.dtype)


def _draw(rng: np.random.Generator, name: str, variable) -> np.ndarray:
    shape, leaf = tuple(variable.shape), name.rsplit("/", 1)[-1]
    if leaf.endswith("kernel") and len(shape) >= 2:
        fan_in = int(np.prod(shape[:2] if "depthwise" in leaf else shape[:-1]))
        return rng.standard_normal(shape) * np.sqrt(2.0 / fan_in)
    if leaf in ("moving_variance", "variance"):
        return rng.uniform(0.5, 1.5, shape)
    if leaf in ("moving_mean", "mean", "beta", "bias"):
        return rng.standard_normal(shape) * 0.1
    if leaf == "gamma":  # small, so the eval-mode residual stream of a seeded network stays bounded
        return rng.uniform(0.2, 0.5, shape)
    initial = np.asarray(variable.numpy(), np.float64)
    if initial.size and np.all(initial == initial.flat[0]):
        return initial  # a constant (layer scale, ...): the same on every backend already
    return rng.standard_normal(shape) * 0.02

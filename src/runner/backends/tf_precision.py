"""precision= on TensorFlow (runner.precision): TF32 execution, and for the mixed policies casts to the compute
dtype inside the model function, its result back in float32 (model=keras applies Keras's mixed policy itself).

TensorFlow is imported inside the functions: only the backend modules import a framework at module level.
"""

from __future__ import annotations

from collections.abc import Callable

from runner.config import ConfigError
from runner.precision import device_refusal

COMPUTE = {"bf16_mixed": "bfloat16", "fp16_mixed": "float16"}  # policy -> the dtype the model computes in
SHIPPED: dict = {}  # TensorFlow's TF32 setting as imported, before prepare() turned it off
POLICY = {"name": "full"}  # the run's policy, set by set_precision: tensorflow_backend.train_step reads it
LOSS_SCALED = ("fp16_mixed",)  # the policies whose training steps scale the loss


def remember_shipped() -> None:
    """Called by tensorflow_backend at import, before anything changes the setting."""
    import tensorflow as tf

    SHIPPED["tf32"] = tf.config.experimental.tensor_float_32_execution_enabled()


def set_precision(precision: str, device: str) -> dict:
    import tensorflow as tf

    if precision in ("tf32", "fp16_mixed") and device != "cuda":
        raise ConfigError(device_refusal(precision, device))
    if precision == "tf32":
        _require_tf32(tf)
    tf32 = {"tf32": True, "default": SHIPPED["tf32"]}.get(precision, False)
    tf.config.experimental.enable_tensor_float_32_execution(tf32)
    POLICY["name"] = precision
    return {
        "precision_policy": _policy_words(precision),
        "tf_tensor_float_32_execution": bool(tf.config.experimental.tensor_float_32_execution_enabled()),
    }


def _require_tf32(tf) -> None:
    details = tf.config.experimental.get_device_details(tf.config.list_physical_devices("GPU")[0])
    capability = details.get("compute_capability") or (0, 0)
    if capability < (8, 0):
        name = details.get("device_name", "this GPU")
        raise ConfigError(
            f"precision=tf32 needs an NVIDIA GPU with TF32 (Ampere or newer); {name} (compute capability "
            f"{capability[0]}.{capability[1]}) has none"
        )


def _policy_words(precision: str) -> str:
    if precision in COMPUTE:
        return (
            f"weights and inputs cast to {COMPUTE[precision]} inside the model function (Keras's mixed_"
            f"{COMPUTE[precision]} policy for model=keras), its result cast to float32; float32 weights, gradients "
            "and optimizer"
            + ("; training steps scale the loss (Keras's LossScaleOptimizer)" if precision == "fp16_mixed" else "")
        )
    return {"full": "float32, TF32 off", "default": "TensorFlow as shipped", "tf32": "TF32 matmuls and convolutions"}[
        precision
    ]


def loss_scaled(keras_optimizer):
    """fp16_mixed: the optimizer inside Keras's LossScaleOptimizer (dynamic loss scaling; the step scales its loss
    with `scale_loss`); any other policy: the optimizer itself, whose `scale_loss` returns the loss unchanged."""
    if POLICY["name"] not in LOSS_SCALED:
        return keras_optimizer
    import keras

    return keras.optimizers.LossScaleOptimizer(keras_optimizer)


def with_precision(fn: Callable, precision: str, device: str) -> Callable:
    if precision not in COMPUTE:
        return fn
    import tensorflow as tf

    compute = tf.as_dtype(COMPUTE[precision])

    def to(dtype, structure):
        return tf.nest.map_structure(lambda a: tf.cast(a, dtype) if tf.as_dtype(a.dtype).is_floating else a, structure)

    def mixed(*args):
        return to(tf.float32, fn(*to(compute, args)))

    return mixed

"""TensorFlow backend: GradientTape for gradients and jacobians, tf.function (optionally XLA)."""

from __future__ import annotations

import os
from collections.abc import Callable

from runner.config import ConfigError, nvidia_driver_present

# Before the import: silence C++ start-up chatter (and, without a GPU driver, the cuInit error).
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2" if nvidia_driver_present() else "3")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

DTYPES = {"float16": tf.float16, "float32": tf.float32, "float64": tf.float64, "bfloat16": tf.bfloat16}


def prepare(device: str, dtype: str) -> str:
    has_gpu = bool(tf.config.list_physical_devices("GPU"))
    if device == "auto":
        device = "cuda" if has_gpu else "cpu"
    if device == "cuda" and not has_gpu:
        raise ConfigError("device=cuda but tensorflow sees no GPU (use device=cpu or auto)")
    # TF32 would make float32 matmuls on Ampere+ GPUs disagree with the other backends.
    tf.config.experimental.enable_tensor_float_32_execution(False)
    return device


def _tf_device(device: str) -> str:
    return "/GPU:0" if device == "cuda" else "/CPU:0"


def asarray(array: np.ndarray, device: str, dtype: str) -> tf.Tensor:
    with tf.device(_tf_device(device)):
        return tf.identity(tf.cast(tf.convert_to_tensor(array), DTYPES[dtype]))


def to_numpy(native: tf.Tensor) -> np.ndarray:
    if native.dtype == tf.bfloat16:
        native = tf.cast(native, tf.float32)
    return native.numpy()


def synchronizer(device: str) -> Callable[[], None]:
    # Eager CPU kernels finish before they return; GPU kernels are queued.
    return tf.test.experimental.sync_devices if device == "cuda" else _no_sync


def _no_sync() -> None:
    return None


def compile(fn: Callable, mode: str, device: str) -> Callable:
    if mode == "xla":
        fn = tf.function(fn, jit_compile=True)
    elif mode != "eager":  # function, and the per-example maps, which seed 003 runs in tf.function
        fn = tf.function(fn)
    return _placed(fn, device)


def _placed(fn: Callable, device: str) -> Callable:
    """Run fn on the chosen device; TF would otherwise put ops on a GPU whenever one is visible."""
    if device == "cuda" or not tf.config.list_physical_devices("GPU"):
        return fn
    name = _tf_device(device)

    def on_device(*args):
        with tf.device(name):
            return fn(*args)

    return on_device


def grad(loss: Callable, manual: Callable | None) -> Callable:
    def gradients(params: dict, x: tf.Tensor, labels: tf.Tensor) -> dict:
        with tf.GradientTape() as tape:
            tape.watch(list(params.values()))  # plain tensors, not tf.Variables: watch them
            value = loss(params, x, labels)
        return tape.gradient(value, params)

    return gradients


def per_example_grad(loss: Callable, mode: str, manual: Callable | None) -> Callable:
    batch_grad = grad(loss, manual)

    def per_example(params: dict, x: tf.Tensor, labels: tf.Tensor) -> dict:
        def single(example):
            xi, label = example
            return batch_grad(params, tf.expand_dims(xi, 0), tf.expand_dims(label, 0))

        if mode == "vectorized_map":
            return tf.vectorized_map(single, (x, labels))
        signature = {name: tf.TensorSpec(p.shape, p.dtype) for name, p in params.items()}
        return tf.map_fn(single, (x, labels), fn_output_signature=signature)

    return per_example


def batch_jacobian(forward: Callable, manual: Callable | None) -> Callable:
    def jacobian(params: dict, x: tf.Tensor) -> tf.Tensor:
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = forward(params, x)
        return tape.batch_jacobian(y, x)

    return jacobian


def reset_peak_memory(device: str) -> None:
    if device == "cuda":
        tf.config.experimental.reset_memory_stats("GPU:0")


def peak_device_mb(device: str) -> float | None:
    if device != "cuda":
        return None
    return tf.config.experimental.get_memory_info("GPU:0")["peak"] / 2**20


def environment(device: str) -> dict:
    env = {
        "framework": "tensorflow",
        "framework_version": tf.__version__,
        "tf_intra_op_threads": tf.config.threading.get_intra_op_parallelism_threads(),
        "tf_inter_op_threads": tf.config.threading.get_inter_op_parallelism_threads(),
        "tf_gpus": [d.name for d in tf.config.list_physical_devices("GPU")],
        "tf32": tf.config.experimental.tensor_float_32_execution_enabled(),
    }
    if device == "cuda":
        details = tf.config.experimental.get_device_details(tf.config.list_physical_devices("GPU")[0])
        env["device_name"] = details.get("device_name", "GPU")
    return env


# -- ops --------------------------------------------------------------------------------------


def linear(x: tf.Tensor, weight: tf.Tensor, bias: tf.Tensor | None = None) -> tf.Tensor:
    y = tf.matmul(x, weight, transpose_b=True)
    return y if bias is None else y + bias


relu = tf.nn.relu
matmul = tf.matmul
exp = tf.exp
square = tf.square
sum = tf.reduce_sum  # noqa: A001 - the ops namespace mirrors the frameworks' names

"""TensorFlow backend: GradientTape for gradients and jacobians, tf.function (optionally XLA)."""

from __future__ import annotations

import os
from collections.abc import Callable

from runner.backends.channels_last import (  # noqa: F401 - re-exported: the backend function set
    adaptive_bins,
    from_native_layout,
    to_native_layout,
)
from runner.backends.first_call import tf_parts as first_call_parts  # noqa: F401 - runner.backends.first_call
from runner.backends.first_call import watch_tf_function
from runner.backends.optimizers import Optimizer, keras_optimizer
from runner.config import ConfigError, nvidia_driver_present

# Before the import: silence C++ start-up chatter (and, without a GPU driver, the cuInit error).
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2" if nvidia_driver_present() else "3")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from runner.backends import fixed_attention_kernel, table_layout_ops, tf_precision, tnp_precision  # noqa: E402
from runner.backends.tf_precision import set_precision, with_precision  # noqa: E402, F401 - the backend function set

DTYPES = {"float16": tf.float16, "float32": tf.float32, "float64": tf.float64, "bfloat16": tf.bfloat16}
tf_precision.remember_shipped()  # before prepare() turns TF32 off: what precision=default restores


def set_threads(threads: int) -> None:
    tf.config.threading.set_intra_op_parallelism_threads(threads)  # before TensorFlow's runtime starts


def prepare(device: str, dtype: str) -> str:
    has_gpu = bool(tf.config.list_physical_devices("GPU"))
    if device == "auto":
        device = "cuda" if has_gpu else "cpu"
    if device == "cuda" and not has_gpu:
        raise ConfigError("device=cuda but tensorflow sees no GPU (use device=cpu or auto)")
    # TF32 would make float32 matmuls on Ampere+ GPUs disagree with the other backends.
    tf.config.experimental.enable_tensor_float_32_execution(False)
    tnp_precision.tensorflow_rules()  # where a tnp job before this one set NumPy's
    return device


def _tf_device(device: str) -> str:
    return "/GPU:0" if device == "cuda" else "/CPU:0"


def asarray(array: np.ndarray, device: str, dtype: str) -> tf.Tensor:
    with tf.device(_tf_device(device)):
        return tf.identity(tf.cast(tf.convert_to_tensor(array), DTYPES[dtype]))


def to_numpy(native: tf.Tensor) -> np.ndarray:
    if isinstance(native, np.ndarray):  # already host memory (a conversion's result)
        return native
    if native.dtype == tf.bfloat16:
        native = tf.cast(native, tf.float32)
    return native.numpy()


def synchronizer(device: str) -> Callable[[], None]:
    # Eager CPU kernels finish before they return; GPU kernels are queued.
    return tf.test.experimental.sync_devices if device == "cuda" else _no_sync


def _no_sync() -> None:
    return None


def compile_step(fn: Callable, mode: str, device: str) -> Callable:
    if mode == "xla":
        fn = watch_tf_function(tf.function(fn, jit_compile=True))
    elif mode != "eager":  # function, and the per-example maps, which the TF-NumPy guide runs in tf.function
        fn = watch_tf_function(tf.function(fn))
    return _placed(fn, device)


def compile_model(fn: Callable, mode: str, device: str) -> Callable:
    return fn  # the whole step is compiled (compile), the tape inside it


def trainable(params: dict) -> dict:
    return params  # plain tensors: the tape watches them


def _placed(fn: Callable, device: str) -> Callable:
    """Run fn on the chosen device; TF would otherwise put ops on a GPU whenever one is visible."""
    if device == "cuda" or not tf.config.list_physical_devices("GPU"):
        return fn
    name = _tf_device(device)

    def on_device(*args):
        with tf.device(name):
            return fn(*args)

    return on_device


def grad(loss: Callable, numpy_backprop: Callable | None) -> Callable:
    def gradients(params: dict, x: tf.Tensor, labels: tf.Tensor) -> dict:
        with tf.GradientTape() as tape:
            tape.watch(list(params.values()))  # plain tensors, not tf.Variables: watch them
            value = loss(params, x, labels)
        return tape.gradient(value, params)

    return gradients


def per_example_grad(loss: Callable, mode: str, numpy_backprop: Callable | None) -> Callable:
    batch_grad = grad(loss, numpy_backprop)

    def per_example(params: dict, x: tf.Tensor, labels: tf.Tensor) -> dict:
        def single(example):
            xi, label = example
            return batch_grad(params, tf.expand_dims(xi, 0), tf.expand_dims(label, 0))

        if mode == "vectorized_map":
            return tf.vectorized_map(single, (x, labels))
        signature = {name: tf.TensorSpec(p.shape, p.dtype) for name, p in params.items()}
        return tf.map_fn(single, (x, labels), fn_output_signature=signature)

    return per_example


def batch_jacobian(forward: Callable, mode: str, numpy_backprop: Callable | None) -> Callable:
    def jacobian(params: dict, x: tf.Tensor) -> tf.Tensor:
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = forward(params, x)
        return tape.batch_jacobian(y, x)

    return jacobian


# task=train_step: Keras's optimizers, so the float64 reference follows Keras's formulas (runner.backends.optimizers)
OPTIMIZER_CONVENTION = "keras"
TRAIN_STEP_COMPILED = {
    "function": "tf.function of the whole step (tape and apply_gradients)",
    "xla": "tf.function(jit_compile=True) of the whole step (tape and apply_gradients)",
}


def train_step(
    loss: Callable, params: dict, optimizer: Optimizer, mode: str, device: str, numpy_backprop: Callable | None
) -> tuple[Callable, Callable[[], dict]]:
    """A custom training step as TensorFlow users write it: tf.Variable weights, the tape's gradients applied by a
    keras.optimizers optimizer; inside tf.function for mode=function, jit_compile for xla (compile_step).
    precision=fp16_mixed scales the loss (Keras's LossScaleOptimizer: scale_loss, then apply_gradients unscales)."""
    with tf.device(_tf_device(device)):
        weights = {name: tf.Variable(p) for name, p in params.items()}
        variables = list(weights.values())
        keras_optimizer = tf_precision.loss_scaled(_keras_optimizer(optimizer, variables[0].dtype))
        keras_optimizer.build(variables)  # its slots on the device, before tf.function traces the step

    def step(x: tf.Tensor, labels: tf.Tensor) -> tf.Tensor:
        with tf.GradientTape() as tape:
            value = loss(weights, x, labels)
            scaled = keras_optimizer.scale_loss(value)  # the loss itself unless the optimizer scales it
        keras_optimizer.apply_gradients(zip(tape.gradient(scaled, variables), variables, strict=True))
        return value

    return compile_step(step, mode, device), lambda: weights


def _keras_optimizer(optimizer: Optimizer, dtype: tf.DType):
    import keras

    if keras.backend.backend() != "tensorflow":
        raise ConfigError(
            f"Keras runs on {keras.backend.backend()} in this process: backend=tensorflow task=train_step needs "
            "it on tensorflow (run in a fresh process: isolation=process)"
        )
    return keras_optimizer(keras, optimizer, dtype.name)


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
    """weight held as (in, out): see to_native_layout. Inputs of rank > 2 (the transformer's (batch, seq, features))
    go through tf.tensordot, as Keras's Dense takes them: tf.matmul's broadcasting batch matmul crashes the process
    (SIGSEGV, or glibc's munmap_chunk abort) under tf.vectorized_map in float32."""
    y = tf.matmul(x, weight) if x.shape.rank == 2 else tf.tensordot(x, weight, 1)
    return y if bias is None else y + bias


relu = tf.nn.relu
matmul = tf.matmul
exp = tf.exp
square = tf.square
sum = tf.reduce_sum  # noqa: A001 - the ops namespace mirrors the frameworks' names

KERAS_BACKEND = "tensorflow"  # op family `keras` (model=keras)


# -- attention ops (the transformer, GPT-2, Llama): einsum + softmax, as Keras's MultiHeadAttention computes it --


def layer_norm(x, weight, bias, eps: float = 1e-5):
    mean, var = tf.nn.moments(x, axes=[-1], keepdims=True)
    return (x - mean) * tf.math.rsqrt(var + eps) * weight + bias


def gelu(x):
    """tf.nn.gelu(approximate=False)'s own formula, with its constant 1/sqrt(2) made in x's dtype: tf.nn.gelu casts
    a float32 constant, so in float64 it is off by up to 5e-9 (docs/transformer.md)."""
    return 0.5 * x * tf.math.erfc(-x * tf.constant(np.sqrt(0.5), x.dtype))


def split_heads(qkv: tf.Tensor, heads: int) -> list[tf.Tensor]:
    _, seq, three_d = qkv.shape
    split = tf.reshape(qkv, (-1, seq, 3, heads, three_d // 3 // heads))
    return tf.unstack(tf.transpose(split, (2, 0, 3, 1, 4)))


def merge_heads(x: tf.Tensor) -> tf.Tensor:
    _, heads, seq, size = x.shape
    return tf.reshape(tf.transpose(x, (0, 2, 1, 3)), (-1, seq, heads * size))


def attention(
    q: tf.Tensor, k: tf.Tensor, v: tf.Tensor, mask: tf.Tensor | None = None, causal: bool = False
) -> tf.Tensor:
    """Keras MultiHeadAttention's computation: queries scaled, einsum to scores, masked softmax, einsum to values."""
    scores = tf.einsum("bhqd,bhkd->bhqk", q * tf.constant(1 / np.sqrt(q.shape[-1]), q.dtype), k)
    mask = tf.constant(np.tri(q.shape[-2], k.shape[-2], dtype=bool)) if causal else mask
    if mask is not None:
        scores = tf.where(mask, scores, tf.constant(-np.inf, scores.dtype))
    return tf.einsum("bhqk,bhkd->bhqd", tf.nn.softmax(scores, axis=-1), v)


attention_kernel = fixed_attention_kernel("tf.einsum + tf.nn.softmax (Keras MultiHeadAttention's computation)")


# -- convnet ops: NHWC inside, torch (NCHW, OIHW) conventions at the edges ----------------------


def from_nchw(x: tf.Tensor) -> tf.Tensor:
    return tf.transpose(x, (0, 2, 3, 1))


def to_nchw(x: tf.Tensor) -> tf.Tensor:
    return tf.transpose(x, (0, 3, 1, 2))


def conv2d(x, weight, bias=None, stride: int = 1, padding: int = 0):
    # Explicit zero padding, as torch pads (not "SAME"); a separate tf.pad because TF's vectorized_map
    # loses Conv2D's own explicit_paddings in the filter gradient.
    if padding:
        x = tf.pad(x, [[0, 0], [padding, padding], [padding, padding], [0, 0]])
    y = tf.nn.conv2d(x, weight, strides=stride, padding="VALID")
    return y if bias is None else y + bias


def conv_transpose2d(x, weight, bias=None, stride: int = 1, padding: int = 0, output_padding: int = 0):
    """torch's ConvTranspose2d: the full transposed convolution, cropped by `padding` at the start and
    by `padding - output_padding` at the end."""
    n, h, w = tf.shape(x)[0], x.shape[1], x.shape[2]
    k = weight.shape[0]
    full = ((h - 1) * stride + k, (w - 1) * stride + k)
    y = tf.nn.conv2d_transpose(x, weight, (n, *full, weight.shape[2]), strides=stride, padding="VALID")
    end = padding - output_padding
    y = y[:, padding : full[0] - end, padding : full[1] - end, :]
    return y if bias is None else y + bias


def batch_norm(x, mean, var, weight, bias, eps: float = 1e-5):
    return (x - mean) * (weight / tf.sqrt(var + eps)) + bias


def instance_norm(x, eps: float = 1e-5):
    mean, var = tf.nn.moments(x, axes=(1, 2), keepdims=True)
    return (x - mean) / tf.sqrt(var + eps)


def max_pool2d(x, kernel: int, stride: int, padding: int = 0):
    if padding:  # torch pads max-pooling with -inf
        pads = [[0, 0], [padding, padding], [padding, padding], [0, 0]]
        x = tf.pad(x, pads, constant_values=x.dtype.min)
    return tf.nn.max_pool2d(x, kernel, stride, "VALID")


def adaptive_avg_pool2d(x, size: tuple[int, int]):
    """torch's AdaptiveAvgPool2d: output bin i averages rows floor(i*H/out) .. ceil((i+1)*H/out)."""
    h, w = x.shape[1], x.shape[2]
    if tuple(size) == (1, 1):
        return tf.reduce_mean(x, axis=(1, 2), keepdims=True)
    rows, cols = adaptive_bins(h, size[0]), adaptive_bins(w, size[1])
    pooled = [
        tf.stack([tf.reduce_mean(x[:, r0:r1, c0:c1, :], axis=(1, 2)) for c0, c1 in cols], axis=1) for r0, r1 in rows
    ]
    return tf.stack(pooled, axis=1)


def reflection_pad2d(x, pad: int):
    """Reflection padding from slices (tf.pad's MirrorPad has no tf.vectorized_map converter)."""
    x = tf.concat([x[:, pad:0:-1], x, x[:, -2 : -pad - 2 : -1]], axis=1)
    return tf.concat([x[:, :, pad:0:-1], x, x[:, :, -2 : -pad - 2 : -1]], axis=2)


def flatten(x):
    """Flatten in torch's (C, H, W) order, so a classifier's weights mean the same on both backends."""
    x = to_nchw(x)
    return tf.reshape(x, (tf.shape(x)[0], -1))


tanh = tf.tanh


# -- memory-layout ops (seeds 001 and 002) -------------------------------------------------------

FROM_HOST = {  # numpy -> tf
    "convert_to_tensor": tf.convert_to_tensor,
    "constant": tf.constant,
    "from_dlpack": lambda host: tf.experimental.dlpack.from_dlpack(host.__dlpack__()),
}
RESHAPES = {
    "reshape": lambda x: tf.reshape(x, [-1]),
    "transpose": tf.transpose,
    "transpose_reshape": lambda x: tf.reshape(tf.transpose(x), [-1]),
}


convert, reshape = table_layout_ops("tensorflow", FROM_HOST, RESHAPES, to_host=lambda native: native.numpy())


def data_pointer(array) -> int:
    """Where the bytes live. tf.Tensor.numpy() returns a copy; _numpy() is the view of the CPU buffer."""
    host = array._numpy() if isinstance(array, tf.Tensor) else array
    return host.__array_interface__["data"][0]


from runner.backends.tf_decoder import *  # noqa: E402, F403 - op family `decoder` (model=gpt2)

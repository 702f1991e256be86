"""tf.experimental.numpy backend: TensorFlow's machinery with NumPy-style ops and type promotion.

Everything but the ops and `prepare` is the tensorflow backend's: tnp arrays are tf.Tensors.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from runner.backends import fixed_attention_kernel
from runner.backends import tensorflow_backend as tf_backend
from runner.backends.optimizers import Optimizer, written_out_step
from runner.backends.tensorflow_backend import (  # noqa: F401 - re-exported: the backend function set
    DTYPES,
    adaptive_avg_pool2d,
    asarray,
    batch_jacobian,
    batch_norm,
    compile_model,
    compile_step,
    conv2d,
    conv_transpose2d,
    convert,
    data_pointer,
    environment,
    first_call_parts,
    flatten,
    from_native_layout,
    from_nchw,
    grad,
    instance_norm,
    max_pool2d,
    peak_device_mb,
    per_example_grad,
    reflection_pad2d,
    reset_peak_memory,
    reshape,
    set_threads,
    synchronizer,
    to_native_layout,
    to_nchw,
    to_numpy,
    trainable,
)
from runner.backends.tnp_precision import enable_numpy_behavior, exp, sqrt, tanh  # noqa: F401 - tanh re-exported
from runner.config import ConfigError
from runner.precision import only_full

tnp = tf_backend.tf.experimental.numpy  # imported through the tensorflow backend, which quiets TF's logs


def prepare(device: str, dtype: str) -> str:
    device = tf_backend.prepare(device, dtype)
    enable_numpy_behavior()  # after TensorFlow's, which sets its own type rules
    return device


def set_precision(precision: str, device: str) -> dict:
    """Only precision=full (conf/precision refuses the others): tnp's NumPy semantics keep float32 float32."""
    if precision != "full":
        raise ConfigError(only_full("tnp", precision))
    return tf_backend.set_precision(precision, device)


def with_precision(fn: Callable, precision: str, device: str) -> Callable:
    return fn  # full: nothing to wrap


OPTIMIZER_CONVENTION = "torch"  # the written-out update (runner.backends.optimizers)
TRAIN_STEP_COMPILED = {
    "function": "tf.function of the whole step (tape and written-out update)",
    "xla": "tf.function(jit_compile=True) of the whole step (tape and written-out update)",
}


def train_step(
    loss: Callable, params: dict, optimizer: Optimizer, mode: str, device: str, numpy_backprop: Callable | None
) -> tuple[Callable, Callable[[], dict]]:
    """The explicit backprop and the update written out, as the TF-NumPy guide trains its model: the tape's
    gradients (grad) and the optimizer's arithmetic on tnp arrays, the whole update in tf.function (jit_compile
    for xla) in the compiled modes. Adam's step count is an array, so the compiled update traces once."""
    compile_update = lambda fn: compile_step(fn, mode, device)  # noqa: E731
    return written_out_step(grad(loss, numpy_backprop), params, optimizer, sqrt, compile_update)


# -- ops: written with tnp, as the TF-NumPy guide writes its model ----------------------------------------


def linear(x, weight, bias=None):
    # weight held as (in, out), as the TF-NumPy guide writes it; rank > 2 through tensordot, as the tensorflow
    # backend does (its broadcasting matmul crashes under tf.vectorized_map in float32)
    y = tnp.matmul(x, weight) if x.ndim == 2 else tnp.tensordot(x, weight, 1)
    return y if bias is None else y + bias


def relu(x):
    return tnp.maximum(x, 0)


matmul = tnp.matmul

square = tnp.square
sum = tnp.sum  # noqa: A001 - the ops namespace mirrors the frameworks' names


def layer_norm(x, weight, bias, eps: float = 1e-5):
    mean = tnp.mean(x, -1, keepdims=True)
    var = tnp.mean(tnp.square(x - mean), -1, keepdims=True)
    return (x - mean) / sqrt(var + eps) * weight + bias


def gelu(x):
    return 0.5 * x * (1 + tf_backend.tf.math.erf(x * (0.5**0.5)))  # tnp has no erf: TensorFlow's, on the same tensor


def split_heads(qkv, heads: int):
    _, seq, three_d = qkv.shape
    split = tnp.transpose(tnp.reshape(qkv, (-1, seq, 3, heads, three_d // 3 // heads)), (2, 0, 3, 1, 4))
    return split[0], split[1], split[2]


def merge_heads(x):
    _, heads, seq, size = x.shape
    return tnp.reshape(tnp.transpose(x, (0, 2, 1, 3)), (-1, seq, heads * size))


def attention(q, k, v, mask=None, causal: bool = False):
    """Attention as NumPy code writes it, on tnp: matmuls and a softmax written out."""
    scores = tnp.matmul(q, tnp.swapaxes(k, -1, -2)) / float(np.sqrt(q.shape[-1]))
    mask = np.tri(q.shape[-2], k.shape[-2], dtype=bool) if causal else mask
    if mask is not None:
        scores = tnp.where(mask, scores, -np.inf)
    weights = exp(scores - tnp.max(scores, axis=-1, keepdims=True))
    return tnp.matmul(weights / tnp.sum(weights, axis=-1, keepdims=True), v)


attention_kernel = fixed_attention_kernel("tnp: matmul + softmax written out")


from runner.backends.tnp_decoder import *  # noqa: E402, F403 - op family `decoder` (model=gpt2)

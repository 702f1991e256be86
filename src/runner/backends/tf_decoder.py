"""Op family `decoder` in TensorFlow (model=gpt2, llama): the key/value cache in tf.Variables of fixed shape, written in
place at each step's positions, and each step in one tf.function (XLA-compiled in mode=xla) whose inputs keep one
shape from token to token, so it is traced once (`tf_function_traces` in the record says so)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import tensorflow as tf

from runner.backends import DecoderOps, protocol_functions

__all__ = protocol_functions(DecoderOps)  # op family `decoder`: what its backend module takes in by `import *`


def affine(x: tf.Tensor, weight: tf.Tensor, bias: tf.Tensor) -> tf.Tensor:
    return tf.matmul(x, weight) + bias  # weight (in, out): GPT-2's Conv1D; a broadcasting batch matmul, one op


def gelu_tanh(x: tf.Tensor) -> tf.Tensor:
    """tf.nn.gelu(approximate=True)'s formula with its constants made in x's dtype (tf.nn.gelu rounds them to
    float32 first, off by about 1e-9 in float64)."""
    c, a = tf.constant(np.sqrt(2 / np.pi), x.dtype), tf.constant(0.044715, x.dtype)
    return 0.5 * x * (1 + tf.tanh(c * (x + a * x**3)))


def embed(table: tf.Tensor, ids: tf.Tensor) -> tf.Tensor:
    return tf.gather(table, ids)


def step_index(start, ids: tf.Tensor):
    return start  # slices and ranges take it


def attention_mask(where, queries: int, keys: int, pad: tf.Tensor | None = None) -> tf.Tensor:
    slots = where + tf.range(queries)[:, None]
    mask = tf.range(keys)[None, :] <= slots
    if pad is None:
        return mask
    # a padding query sees itself alone: a row of no keys would make NaN, and NaN times a zero weight is NaN
    return (mask & (tf.range(keys) >= tf.minimum(pad[:, None, None], slots)))[:, None]


def _prompt_positions(where, seq: int, pad: tf.Tensor) -> tf.Tensor:
    return tf.maximum(where + tf.range(seq) - pad[:, None], 0)  # (batch, seq): padding at position 0


def positions_embedded(table: tf.Tensor, where, ids: tf.Tensor, pad: tf.Tensor | None = None) -> tf.Tensor:
    if pad is None:
        return tf.gather(table, where + tf.range(tf.shape(ids)[1]))
    return tf.gather(table, _prompt_positions(where, ids.shape[1], pad))


def unembed(x: tf.Tensor, table: tf.Tensor) -> tf.Tensor:
    return tf.matmul(x, table, transpose_b=True)


def write_cache(buffer: tf.Variable, new: tf.Tensor, where) -> tf.Variable:
    buffer[:, :, where : where + new.shape[2]].assign(new)
    return buffer


def last_position(x: tf.Tensor) -> tf.Tensor:
    return x[:, -1]


def greedy(logits: tf.Tensor) -> tf.Tensor:
    return tf.argmax(logits, axis=-1, output_type=tf.int32)[:, None]


def token_ids(array: np.ndarray, device: str) -> tf.Tensor:
    with tf.device(_tf_device(device)):
        return tf.identity(tf.constant(np.asarray(array, np.int32)))


def position(start: int, device: str) -> tf.Tensor:
    with tf.device(_tf_device(device)):
        return tf.identity(tf.constant(start, tf.int32))


def new_cache(layers: int, shape: tuple[int, ...], dtype: str, device: str) -> list:
    with tf.device(_tf_device(device)):
        return [
            [tf.Variable(tf.zeros(shape, tf.as_dtype(dtype)), trainable=False) for _ in range(2)] for _ in range(layers)
        ]


def decoder_step(fn: Callable, params: dict, cache: list, mode: str, device: str) -> Callable:
    """step(ids, start) -> (logits, next ids); the weights and the cache's variables are captured, not arguments
    (tf.function would flatten a dict argument on every call), and the cache is written in place."""

    def step(ids: tf.Tensor, start) -> tuple[tf.Tensor, tf.Tensor]:
        logits, next_ids, _ = fn(params, cache, ids, start)
        return logits, next_ids

    if mode == "eager":
        return step
    return tf.function(step, jit_compile=mode == "xla")


def _tf_device(device: str) -> str:
    return "/GPU:0" if device == "cuda" else "/CPU:0"


def compilations(step: Callable) -> int | None:
    """How many times the step was traced (once for its one input shape: more means retracing); None in eager."""
    count = getattr(step, "experimental_get_tracing_count", None)
    return count() if count else None


# -- model=llama's ops: projections (out, in), RMSNorm, SiLU, grouped heads, rotary embeddings --------------------


def project(x: tf.Tensor, weight: tf.Tensor, bias: tf.Tensor | None = None) -> tf.Tensor:
    y = tf.matmul(x, weight, transpose_b=True)  # weight (out, in): torch.nn.Linear's
    return y if bias is None else y + bias


def rms_norm(x: tf.Tensor, weight: tf.Tensor, eps: float) -> tf.Tensor:
    return x * tf.math.rsqrt(tf.reduce_mean(tf.square(x), axis=-1, keepdims=True) + eps) * weight


def silu(x: tf.Tensor) -> tf.Tensor:
    return tf.nn.silu(x)


def to_heads(x: tf.Tensor, heads: int) -> tf.Tensor:
    _, seq, features = x.shape
    return tf.transpose(tf.reshape(x, (-1, seq, heads, features // heads)), (0, 2, 1, 3))


def repeat_heads(x: tf.Tensor, groups: int) -> tf.Tensor:
    return tf.repeat(x, groups, axis=1)


def rotary_angles(
    inv_freq: tuple[float, ...], where, x: tf.Tensor, pad: tf.Tensor | None = None
) -> tuple[tf.Tensor, tf.Tensor]:
    """The inverse frequencies are a constant of the step's tf.function (in eager, made at each step)."""
    dtype = tf.float64 if x.dtype == tf.float64 else tf.float32  # HF: float32 for float32 and below
    at = where + tf.range(x.shape[1]) if pad is None else _prompt_positions(where, x.shape[1], pad)
    angles = tf.cast(at, dtype)[..., None] * tf.constant(inv_freq, dtype)
    angles = tf.concat([angles, angles], axis=-1)
    angles = angles if pad is None else angles[:, None]  # (batch, 1: every head, seq, head size)
    return tf.cast(tf.cos(angles), x.dtype), tf.cast(tf.sin(angles), x.dtype)


def rotary(x: tf.Tensor, angles: tuple[tf.Tensor, tf.Tensor]) -> tf.Tensor:
    cos, sin = angles
    first, second = tf.split(x, 2, axis=-1)
    return x * cos + tf.concat([-second, first], axis=-1) * sin

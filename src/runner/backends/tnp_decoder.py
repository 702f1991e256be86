"""Op family `decoder` in tf.experimental.numpy (model=gpt2, llama): the arithmetic in NumPy's words; the cache, its
writes and the tf.function around each step are TensorFlow's (runner.backends.tf_decoder), as tnp code uses them."""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from runner.backends import DecoderOps, protocol_functions
from runner.backends.tf_decoder import (  # noqa: F401 - re-exported: the op family's function set
    attention_mask,
    compilations,
    decoder_step,
    new_cache,
    position,
    step_index,
    token_ids,
    write_cache,
)
from runner.backends.tnp_precision import sqrt, tanh

tnp = tf.experimental.numpy


__all__ = protocol_functions(DecoderOps)  # op family `decoder`: what its backend module takes in by `import *`


def affine(x, weight, bias):
    return tnp.matmul(x, weight) + bias


def gelu_tanh(x):
    return 0.5 * x * (1 + tanh(float(np.sqrt(2 / np.pi)) * (x + 0.044715 * x**3)))


def embed(table, ids):
    return tnp.take(table, ids, axis=0)


def _positions(where, seq: int, pad=None):
    """The step's positions, (seq,); per prompt (batch, seq) where left-padded, the padding at position 0."""
    # one integer dtype on both sides: NumPy's promotion of int32 and int64 fails inside a tf.function in TF 2.21
    at = tnp.asarray(where, tnp.int32) + tnp.arange(seq, dtype=tnp.int32)
    return at if pad is None else tnp.maximum(at - pad[:, None], 0)


def positions_embedded(table, where, ids, pad=None):
    return tnp.take(table, _positions(where, ids.shape[1], pad), axis=0)


def unembed(x, table):
    return tnp.matmul(x, tnp.transpose(table))


def last_position(x):
    return x[:, -1]


def greedy(logits):
    return tnp.argmax(logits, axis=-1)[:, None]


# -- model=llama's ops: projections (out, in), RMSNorm, SiLU, grouped heads, rotary embeddings --------------------


def project(x, weight, bias=None):
    y = tnp.matmul(x, tnp.transpose(weight))  # weight (out, in): torch.nn.Linear's
    return y if bias is None else y + bias


def rms_norm(x, weight, eps: float):
    return x / sqrt(tnp.mean(x * x, axis=-1, keepdims=True) + eps) * weight


def silu(x):
    return x * (0.5 + 0.5 * tanh(0.5 * x))  # x * sigmoid(x)


def to_heads(x, heads: int):
    _, seq, features = x.shape
    return tnp.transpose(tnp.reshape(x, (-1, seq, heads, features // heads)), (0, 2, 1, 3))


def repeat_heads(x, groups: int):
    """As HF's repeat_kv: broadcast, then reshape (tnp.repeat in a tf.function logs a deprecation of TF's own)."""
    batch, heads, seq, size = x.shape
    return tnp.reshape(
        tnp.broadcast_to(x[:, :, None], (batch, heads, groups, seq, size)), (-1, heads * groups, seq, size)
    )


def rotary_angles(inv_freq: tuple[float, ...], where, x, pad=None):
    dtype = tnp.float64 if x.dtype == tf.float64 else tnp.float32  # HF: float32 for float32 and below
    angles = _positions(where, x.shape[1], pad).astype(dtype)[..., None] * tnp.asarray(inv_freq, dtype)
    angles = tnp.concatenate([angles, angles], axis=-1)
    angles = angles if pad is None else angles[:, None]  # (batch, 1: every head, seq, head size)
    return tnp.cos(angles).astype(x.dtype), tnp.sin(angles).astype(x.dtype)


def rotary(x, angles):
    cos, sin = angles
    half = x.shape[-1] // 2
    return x * cos + tnp.concatenate([-x[..., half:], x[..., :half]], axis=-1) * sin

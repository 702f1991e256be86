"""Op family `decoder` in tf.experimental.numpy (model=gpt2): the arithmetic in NumPy's words; the cache, its
writes and the tf.function around each step are TensorFlow's (runner.backends.tf_decoder), as tnp code uses them."""

from __future__ import annotations

import numpy as np
import tensorflow as tf

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
from runner.backends.tnp_precision import exp, tanh

tnp = tf.experimental.numpy


__all__ = [  # op family `decoder` (runner.backends.DecoderOps): what its backend module takes in
    "affine",
    "attention_mask",
    "cached_attention_kernel",
    "causal_attention",
    "compilations",
    "decoder_step",
    "embed",
    "gelu_tanh",
    "greedy",
    "last_position",
    "merge_heads",
    "new_cache",
    "position",
    "positions_embedded",
    "split_heads",
    "step_index",
    "token_ids",
    "unembed",
    "write_cache",
]


def affine(x, weight, bias):
    return tnp.matmul(x, weight) + bias


def gelu_tanh(x):
    return 0.5 * x * (1 + tanh(float(np.sqrt(2 / np.pi)) * (x + 0.044715 * x**3)))


def embed(table, ids):
    return tnp.take(table, ids, axis=0)


def positions_embedded(table, where, ids):
    # one integer dtype on both sides: NumPy's promotion of int32 and int64 fails inside a tf.function in TF 2.21
    return tnp.take(table, tnp.asarray(where, tnp.int32) + tnp.arange(ids.shape[1], dtype=tnp.int32), axis=0)


def unembed(x, table):
    return tnp.matmul(x, tnp.transpose(table))


def split_heads(qkv, heads: int):
    batch, seq, three_d = qkv.shape
    split = tnp.transpose(tnp.reshape(qkv, (-1, seq, 3, heads, three_d // 3 // heads)), (2, 0, 3, 1, 4))
    return split[0], split[1], split[2]


def merge_heads(x):
    _, heads, seq, size = x.shape
    return tnp.reshape(tnp.transpose(x, (0, 2, 1, 3)), (-1, seq, heads * size))


def causal_attention(q, k, v, mask):
    scores = tnp.matmul(q, tnp.swapaxes(k, -1, -2)) / float(np.sqrt(q.shape[-1]))
    scores = tnp.where(mask, scores, -np.inf)
    weights = exp(scores - tnp.max(scores, axis=-1, keepdims=True))
    return tnp.matmul(weights / tnp.sum(weights, axis=-1, keepdims=True), v)


def last_position(x):
    return x[:, -1]


def greedy(logits):
    return tnp.argmax(logits, axis=-1)[:, None]


def cached_attention_kernel(cache_shape: tuple[int, ...], queries: int, dtype: str, device: str) -> str:
    return "tnp: matmul + masked softmax written out"

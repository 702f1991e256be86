"""Op family `decoder` in NumPy, written out (model=gpt2, llama): the float64 reference and backend=numpy's
generation."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

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
    "project",
    "repeat_heads",
    "rms_norm",
    "rotary",
    "rotary_angles",
    "silu",
    "split_heads",
    "step_index",
    "to_heads",
    "token_ids",
    "unembed",
    "write_cache",
]


def affine(x: np.ndarray, weight: np.ndarray, bias: np.ndarray) -> np.ndarray:
    return x @ weight + bias  # weight (in, out): GPT-2's Conv1D


def gelu_tanh(x: np.ndarray) -> np.ndarray:
    c = np.asarray(np.sqrt(2 / np.pi), x.dtype)
    return 0.5 * x * (1 + np.tanh(c * (x + np.asarray(0.044715, x.dtype) * x**3)))


def embed(table: np.ndarray, ids: np.ndarray) -> np.ndarray:
    return table[ids]


def step_index(start: int, ids: np.ndarray) -> int:
    return start  # slices take it


def attention_mask(where: int, queries: int, keys: int) -> np.ndarray:
    return np.arange(keys)[None, :] <= where + np.arange(queries)[:, None]


def positions_embedded(table: np.ndarray, where: int, ids: np.ndarray) -> np.ndarray:
    return table[where : where + ids.shape[1]]


def unembed(x: np.ndarray, table: np.ndarray) -> np.ndarray:
    return x @ table.T


def split_heads(qkv: np.ndarray, heads: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(batch, seq, 3 d) -> queries, keys, values, each (batch, heads, seq, d / heads)."""
    batch, seq, three_d = qkv.shape
    split = qkv.reshape(batch, seq, 3, heads, three_d // 3 // heads).transpose(2, 0, 3, 1, 4)
    return split[0], split[1], split[2]


def merge_heads(x: np.ndarray) -> np.ndarray:
    batch, heads, seq, size = x.shape
    return x.transpose(0, 2, 1, 3).reshape(batch, seq, heads * size)


def causal_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, mask: np.ndarray) -> np.ndarray:
    scores = (q @ k.swapaxes(-1, -2)) * np.asarray(1 / np.sqrt(q.shape[-1]), q.dtype)
    scores = np.where(mask, scores, -np.inf)
    weights = np.exp(scores - scores.max(-1, keepdims=True))
    return (weights / weights.sum(-1, keepdims=True)) @ v


def write_cache(buffer: np.ndarray, new: np.ndarray, where: int) -> np.ndarray:
    buffer[:, :, where : where + new.shape[2]] = new  # in place
    return buffer


def last_position(x: np.ndarray) -> np.ndarray:
    return x[:, -1]


def greedy(logits: np.ndarray) -> np.ndarray:
    return logits.argmax(-1)[:, None]


def token_ids(array: np.ndarray, device: str) -> np.ndarray:
    return np.asarray(array, np.int64)


def position(start: int, device: str) -> int:
    return start


def new_cache(layers: int, shape: tuple[int, ...], dtype: str, device: str) -> list:
    return [[np.zeros(shape, np.dtype(dtype)) for _ in range(2)] for _ in range(layers)]


def decoder_step(fn: Callable, params: dict, cache: list, mode: str, device: str) -> Callable:
    """fn(params, cache, ids, start) -> (logits, next ids, cache) as a step(ids, start); the cache is written in
    place."""

    def step(ids: np.ndarray, start: int) -> tuple[np.ndarray, np.ndarray]:
        logits, next_ids, _ = fn(params, cache, ids, start)
        return logits, next_ids

    return step


def compilations(step: Callable) -> int | None:
    return None  # nothing is compiled


def cached_attention_kernel(cache_shape: tuple[int, ...], queries: int, dtype: str, device: str) -> str:
    return "numpy: matmul + masked softmax written out"


# -- model=llama's ops: projections (out, in), RMSNorm, SiLU, grouped heads, rotary embeddings --------------------


def project(x: np.ndarray, weight: np.ndarray, bias: np.ndarray | None = None) -> np.ndarray:
    y = x @ weight.T  # weight (out, in): torch.nn.Linear's
    return y if bias is None else y + bias


def rms_norm(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * weight


def silu(x: np.ndarray) -> np.ndarray:
    return x * (0.5 + 0.5 * np.tanh(0.5 * x))  # x * sigmoid(x), with no overflow for large negative x


def to_heads(x: np.ndarray, heads: int) -> np.ndarray:
    batch, seq, features = x.shape
    return x.reshape(batch, seq, heads, features // heads).transpose(0, 2, 1, 3)


def repeat_heads(x: np.ndarray, groups: int) -> np.ndarray:
    return np.repeat(x, groups, axis=1)


def rotary_angles(inv_freq: tuple[float, ...], where: int, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    dtype = np.float64 if x.dtype == np.float64 else np.float32  # HF: float32 for float32 and below
    angles = np.outer(np.arange(where, where + x.shape[1]).astype(dtype), np.asarray(inv_freq, dtype))
    angles = np.concatenate([angles, angles], axis=-1)
    return np.cos(angles).astype(x.dtype), np.sin(angles).astype(x.dtype)


def rotary(x: np.ndarray, angles: tuple[np.ndarray, np.ndarray]) -> np.ndarray:
    cos, sin = angles
    half = x.shape[-1] // 2
    return x * cos + np.concatenate([-x[..., half:], x[..., :half]], axis=-1) * sin

"""Op family `decoder` in NumPy, written out (model=gpt2, llama): the float64 reference and backend=numpy's
generation."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from runner.backends import DecoderOps, protocol_functions

__all__ = protocol_functions(DecoderOps)  # op family `decoder`: what its backend module takes in by `import *`


def affine(x: np.ndarray, weight: np.ndarray, bias: np.ndarray) -> np.ndarray:
    return x @ weight + bias  # weight (in, out): GPT-2's Conv1D


def gelu_tanh(x: np.ndarray) -> np.ndarray:
    c = np.asarray(np.sqrt(2 / np.pi), x.dtype)
    return 0.5 * x * (1 + np.tanh(c * (x + np.asarray(0.044715, x.dtype) * x**3)))


def embed(table: np.ndarray, ids: np.ndarray) -> np.ndarray:
    return table[ids]


def step_index(start: int, ids: np.ndarray) -> int:
    return start  # slices take it


def attention_mask(where: int, queries: int, keys: int, pad: np.ndarray | None = None) -> np.ndarray:
    slots = where + np.arange(queries)[:, None]
    mask = np.arange(keys)[None, :] <= slots
    if pad is None:
        return mask
    # a padding query sees itself alone: a row of no keys would make NaN, and NaN times a zero weight is NaN
    return (mask & (np.arange(keys) >= np.minimum(pad[:, None, None], slots)))[:, None]


def _prompt_positions(where: int, seq: int, pad: np.ndarray) -> np.ndarray:
    return np.maximum(where + np.arange(seq) - pad[:, None], 0)  # (batch, seq): padding at position 0


def positions_embedded(table: np.ndarray, where: int, ids: np.ndarray, pad: np.ndarray | None = None) -> np.ndarray:
    if pad is None:
        return table[where : where + ids.shape[1]]
    return table[_prompt_positions(where, ids.shape[1], pad)]


def unembed(x: np.ndarray, table: np.ndarray) -> np.ndarray:
    return x @ table.T


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


def rotary_angles(
    inv_freq: tuple[float, ...], where: int, x: np.ndarray, pad: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    at = np.arange(where, where + x.shape[1]) if pad is None else _prompt_positions(where, x.shape[1], pad)
    return rotary_cos_sin(np, inv_freq, at, x, per_prompt=pad is not None)


def rotary_cos_sin(xp: Any, inv_freq: tuple[float, ...], at: Any, x: Any, per_prompt: bool) -> tuple[Any, Any]:
    """(cos, sin) in x's dtype of the angles position x inv_freq at the positions `at`, (seq,) or, per_prompt, (batch,
    seq); computed in float32 (float64 for float64 x), as HF does. Written in the array namespace `xp`: numpy's, and
    jax.numpy's (runner.backends.jax_decoder)."""
    dtype = xp.float64 if x.dtype == xp.float64 else xp.float32  # HF: float32 for float32 and below
    angles = at.astype(dtype)[..., None] * xp.asarray(inv_freq, dtype)
    angles = xp.concatenate([angles, angles], axis=-1)
    angles = angles[:, None] if per_prompt else angles  # (batch, 1: every head, seq, head size)
    return xp.cos(angles).astype(x.dtype), xp.sin(angles).astype(x.dtype)


def rotary(x: np.ndarray, angles: tuple[np.ndarray, np.ndarray]) -> np.ndarray:
    cos, sin = angles
    half = x.shape[-1] // 2
    return x * cos + np.concatenate([-x[..., half:], x[..., :half]], axis=-1) * sin

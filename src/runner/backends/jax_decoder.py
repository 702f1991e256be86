"""Op family `decoder` in JAX (model=gpt2, llama): the prompt's step (prefill) and the one-token decode step each under
jax.jit, the key/value cache donated to them and written in place with dynamic_update_slice, as JAX decoders
(keras_hub's, MaxText's) are written. BENCHMARKS.md compares this with the whole decode in one jitted
lax.fori_loop."""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

from runner.backends import DecoderOps, protocol_functions
from runner.backends.numpy_decoder import rotary_cos_sin, to_heads  # noqa: F401 - to_heads: NumPy's serve

__all__ = protocol_functions(DecoderOps)  # op family `decoder`: what its backend module takes in by `import *`


def affine(x: jax.Array, weight: jax.Array, bias: jax.Array) -> jax.Array:
    return x @ weight + bias  # weight (in, out): GPT-2's Conv1D


def gelu_tanh(x: jax.Array) -> jax.Array:
    return jax.nn.gelu(x, approximate=True)


def embed(table: jax.Array, ids: jax.Array) -> jax.Array:
    return jnp.take(table, ids, axis=0)


def step_index(start, ids: jax.Array):
    return start  # dynamic_slice and dynamic_update_slice take it


def attention_mask(where, queries: int, keys: int, pad: jax.Array | None = None) -> jax.Array:
    slots = where + jnp.arange(queries)[:, None]
    mask = jnp.arange(keys)[None, :] <= slots
    if pad is None:
        return mask
    # a padding query sees itself alone: a row of no keys would make NaN, and NaN times a zero weight is NaN
    return (mask & (jnp.arange(keys) >= jnp.minimum(pad[:, None, None], slots)))[:, None]


def _prompt_positions(where, seq: int, pad: jax.Array) -> jax.Array:
    return jnp.maximum(where + jnp.arange(seq) - pad[:, None], 0)  # (batch, seq): padding at position 0


def positions_embedded(table: jax.Array, where, ids: jax.Array, pad: jax.Array | None = None) -> jax.Array:
    if pad is None:
        return jax.lax.dynamic_slice_in_dim(table, where, ids.shape[1], axis=0)
    return jnp.take(table, _prompt_positions(where, ids.shape[1], pad), axis=0)


def unembed(x: jax.Array, table: jax.Array) -> jax.Array:
    return x @ table.T


def write_cache(buffer: jax.Array, new: jax.Array, where) -> jax.Array:
    zero = jnp.zeros((), jnp.asarray(where).dtype)
    return jax.lax.dynamic_update_slice(buffer, new.astype(buffer.dtype), (zero, zero, where, zero))


def last_position(x: jax.Array) -> jax.Array:
    return x[:, -1]


def greedy(logits: jax.Array) -> jax.Array:
    return jnp.argmax(logits, axis=-1)[:, None]


def token_ids(array: np.ndarray, device: str) -> jax.Array:
    return jax.device_put(np.asarray(array, np.int32), _jax_device(device))


def position(start: int, device: str) -> jax.Array:
    return jax.device_put(np.int32(start), _jax_device(device))


def new_cache(layers: int, shape: tuple[int, ...], dtype: str, device: str) -> list:
    zeros = np.zeros(shape, jnp.dtype(dtype))
    return [[jax.device_put(zeros, _jax_device(device)) for _ in range(2)] for _ in range(layers)]


def decoder_step(fn: Callable, params: dict, cache: list, mode: str, device: str) -> Callable:
    """step(ids, start) -> (logits, next ids). Under jit (mode=function, xla) the cache is donated: XLA writes the
    step's keys and values into the same buffers; the holder `cache` then names the returned arrays."""
    compiled = fn if mode == "eager" else jax.jit(_own(fn), donate_argnums=(1,))

    def step(ids: jax.Array, start) -> tuple[jax.Array, jax.Array]:
        logits, next_ids, written = compiled(params, cache, ids, start)
        cache[:] = [list(kv) for kv in written]
        return logits, next_ids

    step.compiled = compiled  # type: ignore[attr-defined]  # read by compilations()
    return step


def _jax_device(device: str) -> jax.Device:
    return jax.devices("gpu" if device == "cuda" else "cpu")[0]


def _own(fn: Callable) -> Callable:
    """fn as a function of its own: jax.jit keeps one cache per function, so the prefill's and the decode step's
    compilations are counted apart."""
    return lambda *args: fn(*args)


def compilations(step: Callable) -> int | None:
    """How many times the step was compiled (once for its one input shape: more means recompiling); None in eager."""
    size = getattr(getattr(step, "compiled", None), "_cache_size", None)
    return size() if size else None


# -- model=llama's ops: projections (out, in), RMSNorm, SiLU, grouped heads, rotary embeddings --------------------


def project(x: jax.Array, weight: jax.Array, bias: jax.Array | None = None) -> jax.Array:
    y = x @ weight.T  # weight (out, in): torch.nn.Linear's
    return y if bias is None else y + bias


def rms_norm(x: jax.Array, weight: jax.Array, eps: float) -> jax.Array:
    return x * jax.lax.rsqrt(jnp.mean(jnp.square(x), axis=-1, keepdims=True) + eps) * weight


def silu(x: jax.Array) -> jax.Array:
    return jax.nn.silu(x)


def repeat_heads(x: jax.Array, groups: int) -> jax.Array:
    return jnp.repeat(x, groups, axis=1)


def rotary_angles(
    inv_freq: tuple[float, ...], where, x: jax.Array, pad: jax.Array | None = None
) -> tuple[jax.Array, jax.Array]:
    """The inverse frequencies are a constant of the jitted step (in eager, placed at each step)."""
    at = where + jnp.arange(x.shape[1]) if pad is None else _prompt_positions(where, x.shape[1], pad)
    return rotary_cos_sin(jnp, inv_freq, at, x, per_prompt=pad is not None)


def rotary(x: jax.Array, angles: tuple[jax.Array, jax.Array]) -> jax.Array:
    cos, sin = angles
    first, second = jnp.split(x, 2, axis=-1)
    return x * cos + jnp.concatenate([-second, first], axis=-1) * sin

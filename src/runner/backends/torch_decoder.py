"""Op family `decoder` in PyTorch (model=gpt2, llama): a preallocated (static) key/value cache written with index_copy_,
scaled_dot_product_attention over it, and the decode step under torch.compile in mode=function (CUDA graphs,
torch.compile's reduce-overhead mode, on cuda), as HF's static cache runs GPT-2."""

from __future__ import annotations

import functools
from collections.abc import Callable

import numpy as np
import torch
import torch.nn.functional as F

from runner.backends import DecoderOps, protocol_functions

__all__ = protocol_functions(DecoderOps)  # op family `decoder`: what its backend module takes in by `import *`


def affine(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    # weight (in, out): GPT-2's Conv1D. F.linear of its transpose is one addmm, the bias added in the GEMM's epilogue:
    # matmul and a separate add launch two kernels, which an eager decode step on a GPU pays for at every layer
    return F.linear(x, weight.t(), bias)


def gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    return F.gelu(x, approximate="tanh")


def embed(table: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    return F.embedding(ids, table)


def step_index(start, ids: torch.Tensor) -> torch.Tensor:
    """The step's positions as a tensor, made once a step."""
    return start + _arange(ids.shape[1], ids.device)


def attention_mask(where: torch.Tensor, queries: int, keys: int, pad: torch.Tensor | None = None) -> torch.Tensor:
    at = _arange(keys, where.device)
    mask = at[None, :] <= where[:, None]
    if pad is None:
        return mask
    # a padding query sees itself alone: a row of no keys would make NaN, and NaN times a zero weight is NaN
    return (mask & (at >= torch.minimum(pad[:, None, None], where[:, None])))[:, None]


def _arange(n: int, device: torch.device) -> torch.Tensor:
    """0..n-1 on the device: a constant of the graph under torch.compile; in eager, made once per length (each
    torch.arange is a kernel launch on a GPU, ~10 µs a call on the CPU). Never written to: only read."""
    if torch.compiler.is_compiling():
        return torch.arange(n, device=device)
    return _aranged(n, torch.device(device))


@functools.lru_cache(maxsize=64)
def _aranged(n: int, device: torch.device) -> torch.Tensor:
    with torch.inference_mode(False):  # a normal tensor: usable inside and outside inference mode alike
        return torch.arange(n, device=device)


def _prompt_positions(where: torch.Tensor, pad: torch.Tensor) -> torch.Tensor:
    return (where - pad[:, None]).clamp(min=0)  # (batch, seq): padding at position 0


def positions_embedded(
    table: torch.Tensor, where: torch.Tensor, ids: torch.Tensor, pad: torch.Tensor | None = None
) -> torch.Tensor:
    return F.embedding(where if pad is None else _prompt_positions(where, pad), table)


def unembed(x: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    return F.linear(x, table)  # table (vocab, d) is the head's (out, in)


def write_cache(buffer: torch.Tensor, new: torch.Tensor, where: torch.Tensor) -> torch.Tensor:
    return buffer.index_copy_(2, where, new)


def last_position(x: torch.Tensor) -> torch.Tensor:
    return x[:, -1]


def greedy(logits: torch.Tensor) -> torch.Tensor:
    return logits.argmax(-1, keepdim=True)


def token_ids(array: np.ndarray, device: str) -> torch.Tensor:
    return torch.from_numpy(np.asarray(array, np.int64)).to(device)


def position(start: int, device: str) -> torch.Tensor:
    return torch.tensor(start, device=device)


def new_cache(layers: int, shape: tuple[int, ...], dtype: str, device: str) -> list:
    return [[torch.zeros(shape, dtype=getattr(torch, dtype), device=device) for _ in range(2)] for _ in range(layers)]


def decoder_step(fn: Callable, params: dict, cache: list, mode: str, device: str) -> Callable:
    """step(ids, start) -> (logits, next ids), the cache written in place. mode=function: torch.compile with static
    shapes (the prompt's and one token's: two graphs, not one with a dynamic length); on cuda its reduce-overhead
    mode, whose CUDA graphs need the cache at a fixed address (torch._dynamo.mark_static_address). A graph's replay
    writes its outputs into the same buffers as the replay before it, so the logits and the token are cloned
    (batch x vocab numbers on the device, as gpt-fast's decode loop clones its token): read after the next step,
    the graph's own outputs raise 'accessing tensor output of CUDAGraphs that has been overwritten'."""
    graphs = mode == "function" and device == "cuda"
    if mode == "function":
        if graphs:
            for buffer in (b for layer in cache for b in layer):
                torch._dynamo.mark_static_address(buffer)
        fn = torch.compile(fn, dynamic=False, mode="reduce-overhead" if graphs else None)

    @torch.inference_mode()
    def step(ids: torch.Tensor, start) -> tuple[torch.Tensor, torch.Tensor]:
        logits, next_ids, _ = fn(params, cache, ids, start)
        return (logits.clone(), next_ids.clone()) if graphs else (logits, next_ids)

    return step


def compilations(step: Callable) -> int | None:
    """Not read from torch.compile (its counters are process-wide): None."""
    return None


# -- model=llama's ops: projections (out, in), RMSNorm, SiLU, grouped heads, rotary embeddings --------------------


def project(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    return F.linear(x, weight, bias)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return F.rms_norm(x, (x.shape[-1],), weight, eps)


def silu(x: torch.Tensor) -> torch.Tensor:
    return F.silu(x)


def to_heads(x: torch.Tensor, heads: int) -> torch.Tensor:
    batch, seq, features = x.shape
    return x.view(batch, seq, heads, features // heads).transpose(1, 2)


def repeat_heads(x: torch.Tensor, groups: int) -> torch.Tensor:
    return x.repeat_interleave(groups, dim=1)


def rotary_angles(
    inv_freq: tuple[float, ...], where: torch.Tensor, x: torch.Tensor, pad: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    dtype = torch.float64 if x.dtype == torch.float64 else torch.float32  # HF: float32 for float32 and below
    at = where if pad is None else _prompt_positions(where, pad)
    angles = at[..., None].to(dtype) * _frequencies(inv_freq, dtype, where.device)
    angles = torch.cat((angles, angles), dim=-1)
    angles = angles if pad is None else angles[:, None]  # (batch, 1: every head, seq, head size)
    return angles.cos().to(x.dtype), angles.sin().to(x.dtype)


def _frequencies(values: tuple[float, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """The inverse frequencies on the device: a constant of the compiled graph under torch.compile; in eager, placed
    once (a host-to-device copy every step would synchronise the stream on cuda)."""
    if torch.compiler.is_compiling():
        return torch.tensor(values, dtype=dtype, device=device)
    return _placed(values, dtype, device)


@functools.lru_cache(maxsize=16)
def _placed(values: tuple[float, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    return torch.tensor(values, dtype=dtype, device=device)


def rotary(x: torch.Tensor, angles: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    cos, sin = angles
    first, second = x.chunk(2, dim=-1)
    return x * cos + torch.cat((-second, first), dim=-1) * sin

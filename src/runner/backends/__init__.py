"""Backends: one module per framework, each exposing the SAME functions, imported only when chosen.

A backend is a module (named by `module:` in conf/backend/NAME.yaml) that implements `Backend` and
the op families its yaml lists under `ops:` (`DenseOps`, `ConvOps`, `AttentionOps`, `LayoutOps`,
`TorchModuleOps`, `KerasOps`, `DecoderOps`). Its yaml also declares the dtypes, devices and modes it can run, which
`runner.config.check_combination` reads.
tests/test_backend_contract.py checks every backend module against these protocols.

`numpy_backprop` is a workload's explicit float64 backprop (Workload.gradients, .jacobian): numpy, which
has no autodiff, uses it; the autodiff backends ignore it. Arrays are native to the backend unless a name says numpy.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import ModuleType
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from runner.config import ConfigError, nvidia_driver_present

if TYPE_CHECKING:
    from runner.backends.optimizers import Optimizer


class Backend(Protocol):
    """The functions every backend module defines."""

    DTYPES: dict[str, Any]  # dtype name -> the framework's dtype
    # whose formulas its optimizers follow in train_step: "torch" or "keras" (runner.backends.optimizers)
    OPTIMIZER_CONVENTION: str
    # mode -> how train_step compiles the step in that mode (the record's train_step_compiled); {}: it says nothing
    TRAIN_STEP_COMPILED: dict[str, str]

    def set_threads(self, threads: int) -> None:
        """Use `threads` intra-op threads (before the framework's first op)."""

    def prepare(self, device: str, dtype: str) -> str:
        """Configure the framework for a run; resolve device "auto"; ConfigError when it cannot be used."""

    def set_precision(self, precision: str, device: str) -> dict:
        """Configure the framework for `precision=` (runner.precision) on the resolved device, after `prepare`: its
        float32 matmul precision and policy; ConfigError where it cannot. Returns what to record: the policy and
        the matmul precision the framework reports."""

    def with_precision(self, fn: Callable, precision: str, device: str) -> Callable:
        """A model function fn(params, x, ...) under the policy (autocast, or casts to the compute dtype with
        the result back in float32); fn itself where the policy is global (full, default, tf32)."""

    def asarray(self, array: np.ndarray, device: str, dtype: str) -> Any:
        """numpy float64 array -> native array on the device, in dtype."""

    def to_numpy(self, native: Any) -> np.ndarray:
        """Back to host numpy (bfloat16 comes back as float32)."""

    def to_native_layout(self, array: np.ndarray) -> np.ndarray:
        """A weight in torch's layout (OIHW, (out, in)) -> the layout this backend computes with."""

    def from_native_layout(self, array: np.ndarray, per_example: bool = False) -> np.ndarray:
        """The inverse of to_native_layout (per_example: a leading batch axis)."""

    def synchronizer(self, device: str) -> Callable[[], None]:
        """A call that waits for queued device work; a no-op where none is queued."""

    def compile_model(self, fn: Callable, mode: str, device: str) -> Callable:
        """The model (forward or loss) compiled for the mode where the framework's idiom compiles the model
        and differentiates it from outside (torch.compile); fn itself elsewhere."""

    def compile_step(self, fn: Callable, mode: str, device: str) -> Callable:
        """The whole step for the mode: eager / function / xla (TF: the tape inside tf.function); fn itself on
        torch, whose model compile_model compiled."""

    def trainable(self, params: dict) -> dict:
        """The weights as the framework trains them (torch: leaf tensors that require grad)."""

    def grad(self, loss: Callable, numpy_backprop: Callable | None) -> Callable:
        """d loss / d params: fn(params, x, labels) -> {name: array}."""

    def per_example_grad(self, loss: Callable, mode: str, numpy_backprop: Callable | None) -> Callable:
        """The same with a leading batch axis, vectorized or looped as the mode says."""

    def batch_jacobian(self, forward: Callable, mode: str, numpy_backprop: Callable | None) -> Callable:
        """fn(params, x) -> (batch, outputs, inputs)."""

    def train_step(
        self,
        loss: Callable,
        params: dict,
        optimizer: Optimizer,
        mode: str,
        device: str,
        numpy_backprop: Callable | None,
    ) -> tuple[Callable, Callable[[], dict]]:
        """task=train_step as the framework's users write it: (step(x, labels), weights()). Each call of step is one
        step of the optimizer, the weights and its state carried from call to call; weights() reads them.
        OPTIMIZER_CONVENTION names whose formulas its optimizers follow (runner.backends.optimizers), and
        TRAIN_STEP_COMPILED says how each compiled mode compiles the step."""

    def reset_peak_memory(self, device: str) -> None: ...

    def peak_device_mb(self, device: str) -> float | None: ...

    def environment(self, device: str) -> dict:
        """Versions, device name, thread counts."""


class DenseOps(Protocol):
    """Op family `dense`: what the MLP and the op workloads are written with."""

    def linear(self, x: Any, weight: Any, bias: Any = None) -> Any: ...

    def relu(self, x: Any) -> Any: ...

    def matmul(self, a: Any, b: Any) -> Any: ...

    def exp(self, x: Any) -> Any: ...

    def sum(self, x: Any) -> Any: ...

    def square(self, x: Any) -> Any: ...


class ConvOps(Protocol):
    """Op family `conv`: what the convnets are written with (images enter and leave as NCHW)."""

    def from_nchw(self, x: Any) -> Any: ...

    def to_nchw(self, x: Any) -> Any: ...

    def conv2d(self, x: Any, weight: Any, bias: Any = None, stride: int = 1, padding: int = 0) -> Any: ...

    def conv_transpose2d(
        self, x: Any, weight: Any, bias: Any = None, stride: int = 1, padding: int = 0, output_padding: int = 0
    ) -> Any: ...

    def batch_norm(self, x: Any, mean: Any, var: Any, weight: Any, bias: Any, eps: float = 1e-5) -> Any: ...

    def instance_norm(self, x: Any, eps: float = 1e-5) -> Any: ...

    def max_pool2d(self, x: Any, kernel: int, stride: int, padding: int = 0) -> Any: ...

    def adaptive_avg_pool2d(self, x: Any, size: tuple[int, int]) -> Any: ...

    def reflection_pad2d(self, x: Any, pad: int) -> Any: ...

    def flatten(self, x: Any) -> Any: ...

    def tanh(self, x: Any) -> Any: ...

    def relu(self, x: Any) -> Any: ...

    def linear(self, x: Any, weight: Any, bias: Any = None) -> Any: ...


@dataclass(frozen=True)
class AttentionCall:
    """An attention call as AttentionOps.attention_kernel is asked about it: queries of `shape` (batch, heads, queries,
    size) over `keys` keys, with a mask where `masked`, causal where `causal`, differentiated where `differentiated`."""

    shape: tuple[int, int, int, int]
    keys: int
    masked: bool = False
    causal: bool = False
    differentiated: bool = False


class AttentionOps(Protocol):
    """Op family `attention`: the one softmax attention of the transformer, GPT-2 and Llama (runner.models.transformer,
    .decoder, .llama), the packed projection's heads, and the transformer's norm and GELU. Activations are
    (batch, seq, features); heads (batch, heads, seq, head size). Each backend computes attention with its everyday API
    (docs/transformer.md)."""

    def linear(self, x: Any, weight: Any, bias: Any = None) -> Any: ...

    def layer_norm(self, x: Any, weight: Any, bias: Any, eps: float = 1e-5) -> Any:
        """Over the last axis, as torch.nn.LayerNorm (biased variance)."""

    def gelu(self, x: Any) -> Any:
        """The exact (erf) GELU, torch's default."""

    def split_heads(self, qkv: Any, heads: int) -> tuple[Any, Any, Any]:
        """(batch, seq, 3 d) packed queries | keys | values -> three (batch, heads, seq, d / heads)."""

    def merge_heads(self, x: Any) -> Any:
        """(batch, heads, seq, size) -> (batch, seq, heads * size)."""

    def attention(self, q: Any, k: Any, v: Any, mask: Any = None, causal: bool = False) -> Any:
        """Scaled dot-product attention of q (batch, heads, queries, size) over k, v (batch, heads, keys, size), as
        many heads as q (grouped keys and values come through repeat_heads). mask None: every key is seen; else
        booleans, True where a query sees a key: (queries, keys) or (batch, 1, queries, keys), as attention_mask
        makes them. causal: the query at i sees the keys 0 .. i (torch hands it to its fused kernel; others mask)."""

    def attention_kernel(self, like: Any, call: AttentionCall) -> str:
        """What computes `attention` as `call` describes it, in the dtype and on the device of the array `like` (under
        the run's precision policy): the fused kernel the framework's dispatcher picks, or how it is written out. For
        the record."""


class DecoderOps(Protocol):
    """Op family `decoder`: what the decoders and their generation are written with beside the `attention` family
    (runner.models.decoder: GPT-2, runner.models.llama). Weights keep each model's layout on every backend: GPT-2's
    projections (in, out) through `affine`, Llama's (out, in) through `project`, embeddings (vocab, d). Activations are
    (batch, seq, d); heads (batch, heads, seq, head size). `start` is a step's first position, a python int or what
    `position` made of one; `where` is what step_index made of it."""

    def gelu_tanh(self, x: Any) -> Any:
        """GPT-2's GELU, the tanh approximation."""

    def affine(self, x: Any, weight: Any, bias: Any) -> Any:
        """x @ weight + bias, weight (in, out)."""

    def embed(self, table: Any, ids: Any) -> Any:
        """The rows of table (vocab, d) for integer ids (batch, seq)."""

    def step_index(self, start: Any, ids: Any) -> Any:
        """Where a step's ids (batch, seq) go: positions start .. start + seq - 1, in the form this backend's
        positions_embedded, write_cache and attention_mask take (its start, or the positions themselves), made once
        a step."""

    def attention_mask(self, where: Any, queries: int, keys: int, pad: Any = None) -> Any:
        """(queries, keys) booleans: the query at position p sees the keys at positions 0 .. p (in a cache, the
        positions not written yet are masked). pad, (batch,) integers: each prompt's left padding in a batch of
        prompts of different lengths; then (batch, 1, queries, keys), a prompt's keys starting after its padding
        (a padding query sees itself alone)."""

    def positions_embedded(self, table: Any, where: Any, ids: Any, pad: Any = None) -> Any:
        """The rows of the position table at the step's positions; with pad, each prompt's own positions counted
        from its first token (batch, seq, d), padding at position 0."""

    def unembed(self, x: Any, table: Any) -> Any:
        """x @ table.T: the head tied to the token embedding."""

    def write_cache(self, buffer: Any, new: Any, where: Any) -> Any:
        """`new` (batch, heads, t, size) written at the step's positions of the buffer: the buffer after the write
        (the same object where the framework writes in place)."""

    def last_position(self, x: Any) -> Any: ...

    def greedy(self, logits: Any) -> Any:
        """(batch, vocab) -> the most likely ids, (batch, 1) integers."""

    def token_ids(self, array: np.ndarray, device: str) -> Any:
        """Integer ids from numpy, on the device."""

    def position(self, start: int, device: str) -> Any:
        """A step's first position as the compiled step takes it (a device scalar: no retracing per token)."""

    def new_cache(self, layers: int, shape: tuple[int, ...], dtype: str, device: str) -> list:
        """[[keys, values] per layer], each of `shape`, zeros."""

    def decoder_step(self, fn: Callable, params: dict, cache: list, mode: str, device: str) -> Callable:
        """fn(params, cache, ids, start) -> (logits, next ids, cache), compiled for the mode as the framework's users
        write a decode step, as step(ids, start) -> (logits, next ids); the cache kept between calls."""

    def compilations(self, step: Callable) -> int | None:
        """How many times a step from decoder_step was traced or compiled, where the framework says; None."""

    # model=llama (runner.models.llama): its projections keep torch.nn.Linear's (out, in) layout

    def project(self, x: Any, weight: Any, bias: Any = None) -> Any:
        """x @ weight.T (+ bias), weight (out, in) as torch.nn.Linear holds it (the dense family's `linear` takes the
        backend's native layout instead)."""

    def rms_norm(self, x: Any, weight: Any, eps: float) -> Any:
        """x / sqrt(mean(x^2 over the last axis) + eps) * weight."""

    def silu(self, x: Any) -> Any:
        """x * sigmoid(x)."""

    def to_heads(self, x: Any, heads: int) -> Any:
        """(batch, seq, heads * size) -> (batch, heads, seq, size)."""

    def repeat_heads(self, x: Any, groups: int) -> Any:
        """(batch, kv_heads, seq, size) -> (batch, kv_heads * groups, seq, size), each head `groups` times in a row:
        grouped-query attention's keys and values for the query heads."""

    def rotary_angles(self, inv_freq: tuple[float, ...], where: Any, x: Any, pad: Any = None) -> tuple[Any, Any]:
        """(cos, sin), each (seq, head size) in x's dtype, of the angles position x inv_freq at the step's positions
        (`where`, for x's seq positions), the two halves of a head alike; computed in float32 (float64 for float64 x),
        as HF does. inv_freq: the model's head size / 2 inverse frequencies, constants of a compiled step. With pad
        (as attention_mask's), (batch, 1, seq, head size) at each prompt's own positions."""

    def rotary(self, x: Any, angles: tuple[Any, Any]) -> Any:
        """Rotary embedding of x (batch, heads, seq, size): x * cos + rotate_half(x) * sin, rotate_half(x) being
        (-second half, first half)."""


class LayoutOps(Protocol):
    """Op family `layout`: conversions and reshapes, for the memory-layout workloads."""

    def convert(self, method: str, host: np.ndarray, native: Any) -> Any: ...

    def reshape(self, method: str, x: Any) -> Any: ...

    def data_pointer(self, array: Any) -> int: ...


def table_layout_ops(
    backend: str,
    from_host: Mapping[str, Callable],
    reshapes: Mapping[str, Callable],
    to_host: Callable | None = None,
    settle: Callable[[Any], Any] = lambda result: result,
) -> tuple[Callable[[str, np.ndarray, Any], Any], Callable[[str, Any], Any]]:
    """LayoutOps.convert and .reshape of a backend whose conversions (numpy -> its arrays) and reshapes are tables of
    functions by method name: `to_host` is the conversion `numpy` (its array -> numpy) where it has one, `settle` waits
    for a result the framework computes asynchronously (JAX). A method not in the table is one line naming those there
    are."""

    def convert(method: str, host: np.ndarray, native: Any) -> Any:
        if method == "numpy" and to_host is not None:
            return to_host(native)
        if method not in from_host:
            allowed = ", ".join([*(["numpy"] if to_host is not None else []), *from_host])
            raise ConfigError(f"backend={backend} has no conversion {method!r} (allowed: {allowed})")
        return settle(from_host[method](host))

    def reshape(method: str, x: Any) -> Any:
        if method not in reshapes:
            raise ConfigError(f"backend={backend} has no reshape method {method!r} (allowed: {', '.join(reshapes)})")
        return settle(reshapes[method](x))

    return convert, reshape


class TorchModuleOps(Protocol):
    """Op family `torch_module`: a torch.nn.Module called with the runner's parameters (torchvision models)."""

    def functional_call(self, module: Any, params: dict, x: Any) -> Any: ...


class KerasOps(Protocol):
    """Op family `keras`: the backend Keras 3 runs on in this process (model=keras)."""

    KERAS_BACKEND: str  # Keras's name for it, set as KERAS_BACKEND before keras is imported


OP_FAMILIES: dict[str, type] = {
    "dense": DenseOps,
    "conv": ConvOps,
    "attention": AttentionOps,
    "layout": LayoutOps,
    "decoder": DecoderOps,
    "torch_module": TorchModuleOps,
    "keras": KerasOps,
}


def fixed_attention_kernel(description: str) -> Callable[[Any, AttentionCall], str]:
    """AttentionOps.attention_kernel for a backend whose attention is written out, the same whatever the shapes: what
    it returns is `description`."""

    def attention_kernel(like: Any, call: AttentionCall) -> str:
        return description

    return attention_kernel


def protocol_functions(protocol: type) -> list[str]:
    """The names a module implementing `protocol` must define."""
    members = {name for klass in protocol.__mro__ if klass is not object for name in vars(klass)}
    members |= set(getattr(protocol, "__annotations__", {}))
    return sorted(name for name in members if not name.startswith("_"))


# Set in a cuda job's worker unless the user set them: otherwise each worker's framework takes most of the GPU's
# memory when it starts on it (JAX 75%, TensorFlow all of it), and a second worker alive at once (interleaved
# rounds keep one per job) runs out of memory. Both are read when the framework first starts on the GPU.
GPU_MEMORY_SHARING = {"XLA_PYTHON_CLIENT_PREALLOCATE": "false", "TF_FORCE_GPU_ALLOW_GROWTH": "true"}


def share_gpu_memory(device: str) -> None:
    """Make the frameworks take GPU memory as they need it (GPU_MEMORY_SHARING) in a job on `device`, called
    before its backend is imported; device=auto counts as cuda where an NVIDIA driver is loaded."""
    if device == "cuda" or (device == "auto" and nvidia_driver_present()):
        for name, value in GPU_MEMORY_SHARING.items():
            os.environ.setdefault(name, value)


def load_backend(module: str) -> ModuleType:
    """Import a backend module (and with it, its framework), e.g. "runner.backends.torch_backend"."""
    if {"torch", "tensorflow"} & set(sys.modules) and "triton" not in sys.modules and not nvidia_driver_present():
        # One process running both frameworks (isolation=inline): triton, torch's GPU kernel compiler, then
        # segfaults when it loads after TensorFlow. Without a GPU torch never needs it, so hide it.
        sys.modules["triton"] = None  # type: ignore[assignment]  # None: Python's way to make an import fail
    return importlib.import_module(module)

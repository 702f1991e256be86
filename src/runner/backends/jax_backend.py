"""JAX backend: jax.grad / vmap / jacrev / jacfwd on functions of the weights, jax.jit for the compiled modes.

JAX dispatches asynchronously on every device, the CPU included: a call returns before its result
exists. Every step the runner times therefore ends in `jax.block_until_ready` on its result, so a
timed call is the time to a ready result, as it is on the synchronous CPU backends.

Layouts are Flax's and the TF-NumPy guide's: activations NHWC, conv kernels HWIO, dense weights (in, out).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np

from runner.backends import fixed_attention_kernel, jax_precision, table_layout_ops
from runner.backends.channels_last import (  # noqa: F401 - re-exported: the backend function set
    adaptive_bins,
    from_native_layout,
    to_native_layout,
)
from runner.backends.first_call import jax_parts as first_call_parts  # noqa: F401 - runner.backends.first_call
from runner.backends.jax_precision import set_precision, with_precision  # noqa: F401 - the backend function set
from runner.backends.numpy_backend import merge_heads, split_heads  # noqa: F401 - array methods: NumPy's serve
from runner.backends.optimizers import Optimizer
from runner.config import ConfigError

DTYPES = {"float16": jnp.float16, "float32": jnp.float32, "float64": jnp.float64, "bfloat16": jnp.bfloat16}
jax_precision.remember_shipped()  # before prepare() sets "highest": what precision=default restores


def set_threads(threads: int) -> None:
    """XLA's CPU thread pool has no size setting: it follows the CPU affinity, which JAX's maintainers name
    as the way to limit it. Runs before the first op (the pool is made then)."""
    allowed = sorted(os.sched_getaffinity(0))
    os.sched_setaffinity(0, allowed[: max(1, threads)])


def prepare(device: str, dtype: str) -> str:
    if dtype == "float64":  # JAX computes float64 only with x64 on; without it arrays silently become float32
        jax.config.update("jax_enable_x64", True)
    has_gpu = _has_gpu()
    if device == "auto":
        device = "cuda" if has_gpu else "cpu"
    if device == "cuda" and not has_gpu:
        raise ConfigError("device=cuda but jax has no CUDA backend (pip install 'jax[cuda12]', or use device=cpu)")
    jax.config.update("jax_default_matmul_precision", "highest")  # no TF32/bf16 passes: agree with the others
    return device


def _has_gpu() -> bool:
    try:
        return bool(jax.devices("gpu"))
    except RuntimeError:  # no CUDA plugin installed, or no device it can use
        return False


def _jax_device(device: str) -> jax.Device:
    return jax.devices("gpu" if device == "cuda" else "cpu")[0]


def asarray(array: np.ndarray, device: str, dtype: str) -> jax.Array:
    host = np.asarray(array).astype(np.dtype(DTYPES[dtype]))
    return jax.device_put(host, _jax_device(device)).block_until_ready()


def to_numpy(native: jax.Array) -> np.ndarray:
    host = np.asarray(native)
    return host.astype(np.float32) if host.dtype == ml_dtypes.bfloat16 else host


def synchronizer(device: str) -> Callable[[], None]:
    return _no_sync  # every timed step blocks on its own result (compile)


def _no_sync() -> None:
    return None


def compile_step(fn: Callable, mode: str, device: str) -> Callable:
    """eager: op by op; function: jax.jit; xla: compiled ahead of time (jit's lower().compile()) at the first
    call; the per-example modes run inside jax.jit, as JAX users write vmap and lax.map."""
    if mode == "xla":
        step = _ahead_of_time(fn)
    elif mode == "eager":
        step = fn
    else:
        step = _jit(fn)
    return functools.partial(_blocking, step)


def _blocking(step: Callable, *args):
    return jax.block_until_ready(step(*args))


def _jit(fn: Callable) -> Callable:
    jitted, bound, _ = _jit_bound(fn)
    return functools.partial(jitted, *bound)


def _ahead_of_time(fn: Callable) -> Callable:
    """jax.jit lowered and compiled at the first call; later calls run the compiled executable directly."""
    jitted, bound, static = _jit_bound(fn)
    dynamic = [arg for i, arg in enumerate(bound) if i not in static]  # a Compiled takes no static arguments
    compiled = None

    def call(*args):
        nonlocal compiled
        if compiled is None:
            compiled = functools.partial(jitted.lower(*bound, *args).compile(), *dynamic)
        return compiled(*args)

    return call


def _jit_bound(fn: Callable) -> tuple[Callable, tuple, set[int]]:
    """jax.jit of fn with its bound arguments (weights) passed as arguments, as JAX code passes them: a
    closure would fold them into the compiled program as constants. Bound arguments that hold no arrays
    (the ops module) are static. Returns the jitted function, the bound arguments and the static indices."""
    if not isinstance(fn, functools.partial) or fn.keywords:
        return jax.jit(fn), (), set()
    static = {i for i, arg in enumerate(fn.args) if not all(map(_is_array, jax.tree_util.tree_leaves(arg)))}
    return jax.jit(fn.func, static_argnums=tuple(static)), fn.args, static


def _is_array(leaf) -> bool:
    return isinstance(leaf, jax.Array)


def compile_model(fn: Callable, mode: str, device: str) -> Callable:
    return fn  # the whole step is compiled (compile): jit around grad, as JAX code writes it


def trainable(params: dict) -> dict:
    return params  # jax.grad differentiates a function of the weights: nothing to mark


def grad(loss: Callable, numpy_backprop: Callable | None) -> Callable:
    return jax.grad(loss)


OPTIMIZER_CONVENTION = "torch"  # optax's formulas are torch.optim's
TRAIN_STEP_COMPILED: dict[str, str] = {}  # the record names none (jax.jit of the update in function and xla)


def train_step(
    loss: Callable, params: dict, optimizer: Optimizer, mode: str, device: str, numpy_backprop: Callable | None
) -> tuple[Callable, Callable[[], dict]]:
    """optax's optimizer in a pure update of (weights, optimizer state), as JAX code writes a training step: jax.jit
    donating the old weights and state (xla: compiled ahead of time at the first call); op by op in eager."""
    import optax

    if optimizer.name == "sgd":
        transform = optax.sgd(optimizer.lr, momentum=optimizer.momentum or None)
    else:
        transform = optax.adam(optimizer.lr, b1=optimizer.beta1, b2=optimizer.beta2, eps=optimizer.eps)

    def update(params: dict, state, x: jax.Array, labels: jax.Array):
        value, grads = jax.value_and_grad(loss)(params, x, labels)
        updates, state = transform.update(grads, state, params)
        return optax.apply_updates(params, updates), state, value

    weights = jax.tree.map(jnp.copy, params)  # donated at every step: the job's own arrays stay whole
    held = {"params": weights, "state": transform.init(weights), "update": update}
    if mode != "eager":
        held["update"] = jax.jit(update, donate_argnums=(0, 1))

    def step(x: jax.Array, labels: jax.Array) -> jax.Array:
        if mode == "xla" and isinstance(held["update"], jax.stages.Wrapped):  # the first call compiles
            held["update"] = held["update"].lower(held["params"], held["state"], x, labels).compile()
        held["params"], held["state"], value = held["update"](held["params"], held["state"], x, labels)
        return jax.block_until_ready((held["params"], value))[1]

    return step, lambda: held["params"]


def per_example_grad(loss: Callable, mode: str, numpy_backprop: Callable | None) -> Callable:
    def single_loss(params: dict, x: jax.Array, label: jax.Array) -> jax.Array:
        return loss(params, x[None], label[None])

    single_grad = jax.grad(single_loss)
    if mode == "vectorized_map":
        return jax.vmap(single_grad, in_axes=(None, 0, 0))

    def mapped(params: dict, x: jax.Array, labels: jax.Array) -> dict:
        return jax.lax.map(lambda example: single_grad(params, *example), (x, labels))

    return mapped


def batch_jacobian(forward: Callable, mode: str, numpy_backprop: Callable | None) -> Callable:
    """d y_b / d x_b for every example: the jacobian of one example, vmapped over the batch. Compiled, jacrev
    (one backward pass per output, as JAX's docs advise for fewer outputs than inputs) is the faster; op by op,
    jacfwd, whose forward passes dispatch fewer Python-level ops (both measured in BENCHMARKS.md)."""

    def single(params: dict, x: jax.Array) -> jax.Array:
        return forward(params, x[None])[0]

    differentiate = jax.jacfwd if mode == "eager" else jax.jacrev
    return jax.vmap(differentiate(single, argnums=1), in_axes=(None, 0))


def reset_peak_memory(device: str) -> None:
    return None  # JAX keeps a peak per device that cannot be reset: the run's peak is read as is


def peak_device_mb(device: str) -> float | None:
    if device != "cuda":
        return None
    stats = _jax_device(device).memory_stats() or {}
    return stats["peak_bytes_in_use"] / 2**20 if "peak_bytes_in_use" in stats else None


def environment(device: str) -> dict:
    import jaxlib

    env = {
        "framework": "jax",
        "framework_version": jax.__version__,
        "jaxlib_version": jaxlib.__version__,
        "jax_x64": bool(jax.config.jax_enable_x64),  # type: ignore[attr-defined]  # a flag: set at run time
        "jax_devices": [str(d) for d in jax.devices()],
        "cpu_affinity": len(os.sched_getaffinity(0)),
    }
    if device == "cuda":
        env["device_name"] = _jax_device(device).device_kind
    return env


# -- ops --------------------------------------------------------------------------------------


def linear(x: jax.Array, weight: jax.Array, bias: jax.Array | None = None) -> jax.Array:
    y = x @ weight  # weight held as (in, out): see to_native_layout
    return y if bias is None else y + bias


relu = jax.nn.relu
matmul = jnp.matmul
exp = jnp.exp
square = jnp.square
sum = jnp.sum  # noqa: A001 - the ops namespace mirrors the frameworks' names
tanh = jnp.tanh

KERAS_BACKEND = "jax"  # op family `keras` (model=keras)


# -- attention ops (the transformer, GPT-2, Llama): einsum + jax.nn.softmax, layer norm as Flax writes it ---------


def layer_norm(x, weight, bias, eps: float = 1e-5):
    mean = jnp.mean(x, -1, keepdims=True)
    return (x - mean) * jax.lax.rsqrt(jnp.var(x, -1, keepdims=True) + eps) * weight + bias


def gelu(x):
    return jax.nn.gelu(x, approximate=False)  # JAX's default is the tanh approximation: the exact one, as torch


def attention(
    q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array | None = None, causal: bool = False
) -> jax.Array:
    """Written out, as Flax's dot_product_attention and JAX decoders (keras_hub's, MaxText's) write it:
    jax.nn.dot_product_attention takes its softmax in float32 whatever the dtype (2e-7 off in float64). As there, a
    16-bit dtype's softmax is taken in float32."""
    scores = jnp.einsum("bhqd,bhkd->bhqk", q, k) / jnp.sqrt(jnp.asarray(q.shape[-1], q.dtype))
    mask = jnp.tri(q.shape[-2], k.shape[-2], dtype=bool) if causal else mask
    if mask is not None:
        scores = jnp.where(mask, scores, -jnp.inf)
    weights = jax.nn.softmax(scores.astype(jnp.promote_types(q.dtype, jnp.float32)), axis=-1)
    return jnp.einsum("bhqk,bhkd->bhqd", weights.astype(q.dtype), v)


attention_kernel = fixed_attention_kernel("einsum + jax.nn.softmax (fused by XLA where the step is compiled)")


# -- convnet ops: NHWC inside, torch (NCHW, OIHW) conventions at the edges ----------------------

_NHWC = ("NHWC", "HWIO", "NHWC")


def from_nchw(x: jax.Array) -> jax.Array:
    return jnp.transpose(x, (0, 2, 3, 1))


def to_nchw(x: jax.Array) -> jax.Array:
    return jnp.transpose(x, (0, 3, 1, 2))


def conv2d(x, weight, bias=None, stride: int = 1, padding: int = 0):
    y = jax.lax.conv_general_dilated(x, weight, (stride, stride), [(padding, padding)] * 2, dimension_numbers=_NHWC)
    return y if bias is None else y + bias


def conv_transpose2d(x, weight, bias=None, stride: int = 1, padding: int = 0, output_padding: int = 0):
    """torch's ConvTranspose2d. Its weight (in, out, kH, kW), held as (kH, kW, out, in), is the kernel of the
    convolution it transposes: lax.conv_transpose with transpose_kernel. Torch crops `padding` from the full
    output at the start and `padding - output_padding` at the end: the padding of the dilated input below."""
    k = weight.shape[0]
    pads = [(k - 1 - padding, k - 1 - padding + output_padding)] * 2
    y = jax.lax.conv_transpose(x, weight, (stride, stride), pads, dimension_numbers=_NHWC, transpose_kernel=True)
    return y if bias is None else y + bias


def batch_norm(x, mean, var, weight, bias, eps: float = 1e-5):
    return (x - mean) * (weight * jax.lax.rsqrt(var + eps)) + bias


def instance_norm(x, eps: float = 1e-5):
    mean = jnp.mean(x, axis=(1, 2), keepdims=True)
    var = jnp.var(x, axis=(1, 2), keepdims=True)
    return (x - mean) * jax.lax.rsqrt(var + eps)


def max_pool2d(x, kernel: int, stride: int, padding: int = 0):
    pads = ((0, 0), (padding, padding), (padding, padding), (0, 0))  # torch pads max-pooling with -inf
    return jax.lax.reduce_window(x, -jnp.inf, jax.lax.max, (1, kernel, kernel, 1), (1, stride, stride, 1), pads)


def adaptive_avg_pool2d(x, size: tuple[int, int]):
    """torch's AdaptiveAvgPool2d: output bin i averages rows floor(i*H/out) .. ceil((i+1)*H/out)."""
    h, w = x.shape[1], x.shape[2]
    if tuple(size) == (1, 1):
        return jnp.mean(x, axis=(1, 2), keepdims=True)
    rows, cols = adaptive_bins(h, size[0]), adaptive_bins(w, size[1])
    pooled = [jnp.stack([jnp.mean(x[:, r0:r1, c0:c1, :], axis=(1, 2)) for c0, c1 in cols], axis=1) for r0, r1 in rows]
    return jnp.stack(pooled, axis=1)


def reflection_pad2d(x, pad: int):
    return jnp.pad(x, ((0, 0), (pad, pad), (pad, pad), (0, 0)), mode="reflect")


def flatten(x):
    """Flatten in torch's (C, H, W) order, so a classifier's weights mean the same on every backend."""
    x = to_nchw(x)
    return x.reshape(x.shape[0], -1)


# -- memory-layout ops (seeds 001 and 002) -------------------------------------------------------

FROM_HOST: dict[str, Callable[[np.ndarray], jax.Array]] = {  # numpy -> jax
    "asarray": jnp.asarray,
    "array": jnp.array,
    "device_put": jax.device_put,
    "from_dlpack": jax.dlpack.from_dlpack,
}
RESHAPES = {
    "reshape": lambda x: x.reshape(-1),
    "transpose": jnp.transpose,
    "transpose_reshape": lambda x: jnp.transpose(x).reshape(-1),
}


convert, reshape = table_layout_ops("jax", FROM_HOST, RESHAPES, to_host=np.asarray, settle=jax.block_until_ready)


def data_pointer(array) -> int:
    if isinstance(array, jax.Array):
        return array.unsafe_buffer_pointer()
    return array.__array_interface__["data"][0]


from runner.backends.jax_decoder import *  # noqa: E402, F403 - op family `decoder` (model=gpt2)

"""NumPy backend: eager only, host memory only; gradients come from the workloads' explicit backprop."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from runner.backends import fixed_attention_kernel, table_layout_ops
from runner.backends.optimizers import Optimizer, written_out_step
from runner.config import ConfigError
from runner.precision import only_full

DTYPES = {"float16": np.float16, "float32": np.float32, "float64": np.float64}


def set_threads(threads: int) -> None:
    from threadpoolctl import threadpool_limits

    threadpool_limits(limits=threads, user_api="blas")  # for the rest of the process


def prepare(device: str, dtype: str) -> str:
    return "cpu"  # conf/backend/numpy.yaml allows no other device


def set_precision(precision: str, device: str) -> dict:
    """Only precision=full (conf/precision refuses the others): NumPy has no reduced-precision matmuls."""
    if precision != "full":
        raise ConfigError(only_full("numpy", precision))
    return {"precision_policy": "NumPy: every op in the run's dtype"}


def with_precision(fn: Callable, precision: str, device: str) -> Callable:
    return fn


def asarray(array: np.ndarray, device: str, dtype: str) -> np.ndarray:
    return np.ascontiguousarray(array, dtype=DTYPES[dtype])


def to_numpy(native: np.ndarray) -> np.ndarray:
    return np.asarray(native)


def synchronizer(device: str) -> Callable[[], None]:
    return _no_sync


def _no_sync() -> None:
    return None


def compile_step(fn: Callable, mode: str, device: str) -> Callable:
    return fn  # eager and map_fn, the modes conf/backend/numpy.yaml allows, run fn as it is


def compile_model(fn: Callable, mode: str, device: str) -> Callable:
    return fn


def trainable(params: dict) -> dict:
    return params


def grad(loss: Callable, numpy_backprop: Callable | None) -> Callable:
    return _require(numpy_backprop)


def per_example_grad(loss: Callable, mode: str, numpy_backprop: Callable | None) -> Callable:
    single = _require(numpy_backprop)  # the batch gradient of a one-example slice

    def looped(params: dict, x: np.ndarray, labels: np.ndarray) -> dict:
        per_example = [single(params, x[i : i + 1], labels[i : i + 1]) for i in range(len(x))]
        return {name: np.stack([g[name] for g in per_example]) for name in per_example[0]}

    return looped


def batch_jacobian(forward: Callable, mode: str, numpy_backprop: Callable | None) -> Callable:
    return _require(numpy_backprop)


def _require(numpy_backprop: Callable | None) -> Callable:
    if numpy_backprop is None:
        raise ConfigError("backend=numpy has no autodiff, and this model writes out no backprop for it")
    return numpy_backprop


OPTIMIZER_CONVENTION = "torch"  # the written-out update (runner.backends.optimizers)
TRAIN_STEP_COMPILED: dict[str, str] = {}  # no mode compiles the step


def train_step(
    loss: Callable, params: dict, optimizer: Optimizer, mode: str, device: str, numpy_backprop: Callable | None
) -> tuple[Callable, Callable[[], dict]]:
    """The workload's explicit backprop and the optimizer's update written out (runner.backends.optimizers)."""
    return written_out_step(_require(numpy_backprop), params, optimizer, np.sqrt, lambda fn: fn)


def to_native_layout(array: np.ndarray) -> np.ndarray:
    return array


def from_native_layout(array: np.ndarray, per_example: bool = False) -> np.ndarray:
    return array


def reset_peak_memory(device: str) -> None:
    return None


def peak_device_mb(device: str) -> float | None:
    return None


def environment(device: str) -> dict:
    """No device_name: a CPU run's device is the CPU model (runner.record.environment.collect), not "x86_64"."""
    return {
        "framework": "numpy",
        "framework_version": np.__version__,
        "blas": _blas_name(),
        "blas_threads": _blas_threads(),
    }


def _blas_threads() -> int | None:
    from threadpoolctl import threadpool_info

    counts = [pool["num_threads"] for pool in threadpool_info() if pool["user_api"] == "blas"]
    return max(counts) if counts else None


def _blas_name() -> str:
    try:
        config = np.show_config(mode="dicts")
        return config["Build Dependencies"]["blas"]["name"]
    except Exception:  # the layout of show_config differs across numpy versions
        return "unknown"


# -- ops --------------------------------------------------------------------------------------


def linear(x: np.ndarray, weight: np.ndarray, bias: np.ndarray | None = None) -> np.ndarray:
    y = x @ weight.T
    return y if bias is None else y + bias


def relu(x: np.ndarray) -> np.ndarray:
    return np.maximum(x, 0)


matmul = np.matmul
exp = np.exp
square = np.square


def sum(x: np.ndarray) -> np.ndarray:  # noqa: A001 - the ops namespace mirrors numpy's names
    return np.sum(x)


# -- attention ops (the transformer, GPT-2, Llama): written out, as NumPy has no attention of its own --------


def layer_norm(x: np.ndarray, weight: np.ndarray, bias: np.ndarray, eps: float = 1e-5) -> np.ndarray:
    mean = x.mean(-1, keepdims=True)
    var = np.square(x - mean).mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * weight + bias


def gelu(x: np.ndarray) -> np.ndarray:
    from scipy.special import erf  # imported on first use: a numpy run of another model never pays for it

    return 0.5 * x * (1 + erf(x * np.sqrt(0.5).astype(x.dtype)))


def split_heads(qkv: np.ndarray, heads: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    batch, seq, three_d = qkv.shape
    split = qkv.reshape(batch, seq, 3, heads, three_d // 3 // heads).transpose(2, 0, 3, 1, 4)
    return split[0], split[1], split[2]


def merge_heads(x: np.ndarray) -> np.ndarray:
    batch, heads, seq, size = x.shape
    return x.transpose(0, 2, 1, 3).reshape(batch, seq, heads * size)


def attention(
    q: np.ndarray, k: np.ndarray, v: np.ndarray, mask: np.ndarray | None = None, causal: bool = False
) -> np.ndarray:
    scores = (q @ k.swapaxes(-1, -2)) * np.asarray(1 / np.sqrt(q.shape[-1]), q.dtype)
    mask = np.tri(q.shape[-2], k.shape[-2], dtype=bool) if causal else mask
    if mask is not None:
        scores = np.where(mask, scores, -np.inf)
    weights = np.exp(scores - scores.max(-1, keepdims=True))
    return (weights / weights.sum(-1, keepdims=True)) @ v


attention_kernel = fixed_attention_kernel("numpy: matmul + softmax written out")


# -- memory-layout ops (seeds 001 and 002) -------------------------------------------------------

CONVERSIONS: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "asarray": np.asarray,
    "array": np.array,
}  # numpy -> numpy: no copy / a copy
RESHAPES = {
    "reshape": lambda x: x.reshape(-1),
    "view": lambda x: x.view().reshape(-1),
    "transpose_contiguous": lambda x: np.ascontiguousarray(x.T),
    "transpose_reshape": lambda x: x.T.reshape(-1),
}


convert, reshape = table_layout_ops("numpy", CONVERSIONS, RESHAPES)


def data_pointer(array) -> int:
    return np.asarray(array).__array_interface__["data"][0]


from runner.backends.numpy_decoder import *  # noqa: E402, F403 - op family `decoder` (model=gpt2)

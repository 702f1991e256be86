"""A backend for tests: NumPy arrays held in float64 whatever the dtype says, every op counted.

It shows what a new backend takes: this module (the runner.backends.Backend functions and the
dense op family) and conf/backend/fake.yaml.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

import numpy as np

from runner.backends import numpy_backend

DTYPES = {"float32": np.float64, "float64": np.float64}
CALLS: Counter = Counter()


def set_threads(threads: int) -> None:
    CALLS["set_threads"] += threads


def prepare(device: str, dtype: str) -> str:
    return "cpu"


def set_precision(precision: str, device: str) -> dict:
    return {"precision_policy": "float64 whatever the policy"}


def with_precision(fn: Callable, precision: str, device: str) -> Callable:
    return fn


def asarray(array: np.ndarray, device: str, dtype: str) -> np.ndarray:
    return np.array(array, dtype=np.float64)


def to_numpy(native: np.ndarray) -> np.ndarray:
    return np.asarray(native)


def to_native_layout(array: np.ndarray) -> np.ndarray:
    return array


def from_native_layout(array: np.ndarray, per_example: bool = False) -> np.ndarray:
    return array


def synchronizer(device: str) -> Callable[[], None]:
    return lambda: None


def compile_model(fn: Callable, mode: str, device: str) -> Callable:
    return fn


def compile_step(fn: Callable, mode: str, device: str) -> Callable:
    return fn


def trainable(params: dict) -> dict:
    return params


def grad(loss: Callable, numpy_backprop: Callable | None) -> Callable:
    return numpy_backend.grad(loss, numpy_backprop)


def per_example_grad(loss: Callable, mode: str, numpy_backprop: Callable | None) -> Callable:
    return numpy_backend.per_example_grad(loss, mode, numpy_backprop)


def batch_jacobian(forward: Callable, mode: str, numpy_backprop: Callable | None) -> Callable:
    return numpy_backend.batch_jacobian(forward, mode, numpy_backprop)


OPTIMIZER_CONVENTION = "torch"  # the written-out update (runner.backends.optimizers)
TRAIN_STEP_COMPILED: dict[str, str] = {}  # no mode compiles the step


def train_step(
    loss: Callable, params: dict, optimizer, mode: str, device: str, numpy_backprop: Callable | None
) -> tuple[Callable, Callable[[], dict]]:
    return numpy_backend.train_step(loss, params, optimizer, mode, device, numpy_backprop)


def reset_peak_memory(device: str) -> None:
    return None


def peak_device_mb(device: str) -> float | None:
    return None


def environment(device: str) -> dict:
    return {"framework": "fake", "framework_version": np.__version__, "device_name": "cpu"}


def linear(x, weight, bias=None):
    CALLS["linear"] += 1
    return numpy_backend.linear(x, weight, bias)


def relu(x):
    CALLS["relu"] += 1
    return np.maximum(x, 0)


def matmul(a, b):
    CALLS["matmul"] += 1
    return a @ b


def exp(x):
    CALLS["exp"] += 1
    return np.exp(x)


def sum(x):  # noqa: A001 - the ops namespace mirrors the frameworks' names
    CALLS["sum"] += 1
    return np.sum(x)


def square(x):
    CALLS["square"] += 1
    return np.square(x)

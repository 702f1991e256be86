"""Op workloads: matmul (the CPU-vs-GPU timing post), sigmoid (the TF-NumPy guide's benchmark), conversions and
reshapes (the memory-layout posts). Inference only, no weights."""

from __future__ import annotations

import numpy as np

from runner.config import require_positive
from runner.models import ForwardSize, Workload


class OpWorkload(Workload):
    """An op timed alone (the seeds' micro-benchmarks): inference only, no derivatives (Workload's None), a call is one
    example, and no weights unless it says so."""

    def init_params(self, rng: np.random.Generator) -> dict[str, np.ndarray]:
        return {}

    def examples_per_call(self, batch_size: int) -> int:
        return 1


class Matmul(OpWorkload):
    """x @ x for one n x n matrix (the CPU-vs-GPU post times `tf.matmul(x, x)` on a 1000 x 1000 input)."""

    name = "matmul"

    def __init__(self, n: int):
        require_positive(n=n)
        self.n = n

    def make_inputs(self, rng: np.random.Generator, batch_size: int) -> dict[str, np.ndarray]:
        return {"x": rng.uniform(size=(self.n, self.n))}

    def flops_per_call(self) -> float:
        return 2.0 * self.n**3

    def forward_size(self, batch_size: int) -> ForwardSize:
        return _sized(0, self.n**2, self.n**2, self.flops_per_call())

    def forward(self, ops, params: dict, x):
        return ops.matmul(x, x)

    def size_setting(self, batch_size: int) -> str:
        return f"model.n={self.n}"


class Sigmoid(OpWorkload):
    """1 / (1 + exp(-y)) on a vector of `size` elements, written as the TF-NumPy guide writes it."""

    name = "sigmoid"

    def __init__(self, size: int):
        require_positive(size=size)
        self.size = size

    def size_setting(self, batch_size: int) -> str:
        return f"model.size={self.size}"

    def make_inputs(self, rng: np.random.Generator, batch_size: int) -> dict[str, np.ndarray]:
        return {"x": rng.standard_normal(self.size)}

    def forward_size(self, batch_size: int) -> ForwardSize:
        return _sized(0, self.size, self.size)

    def forward(self, ops, params: dict, x):
        return 1.0 / (1.0 + ops.exp(-x))


class Conversion(OpWorkload):
    """Seed 002: move `size` numbers between numpy and a framework by `method`; does memory get shared?

    numpy -> framework methods read a host array; `numpy` (framework -> numpy) reads a framework tensor.
    """

    name = "conversion"
    numpy_reference = False  # the result is the input, moved: compared by pointer, not by value
    host_params = ("host",)  # kept as a numpy array, not placed on the backend

    def __init__(self, size: int, method: str):
        require_positive(size=size)
        self.size, self.method = size, method

    def init_params(self, rng: np.random.Generator) -> dict[str, np.ndarray]:
        return {"host": rng.standard_normal(self.size)}

    def make_inputs(self, rng: np.random.Generator, batch_size: int) -> dict[str, np.ndarray]:
        return {"x": rng.standard_normal(self.size)}

    def forward_size(self, batch_size: int) -> ForwardSize:
        return _sized(self.size, self.size, self.size)

    def forward(self, ops, params: dict, x):
        return ops.convert(self.method, params["host"], x)

    def extra_metrics(self, ops, params: dict, inputs: dict, output) -> dict[str, float]:
        sources = {ops.data_pointer(params["host"]), ops.data_pointer(inputs["x"])}
        return {
            "shares_memory": float(ops.data_pointer(output) in sources),
            "result_is_float64": float("float64" in str(output.dtype)),
        }


class Reshape(OpWorkload):
    """Seed 001: view / reshape / transpose + contiguous of an n x n matrix; did a copy happen?"""

    name = "reshape"
    numpy_reference = False

    def __init__(self, n: int, method: str):
        require_positive(n=n)
        self.n, self.method = n, method

    def make_inputs(self, rng: np.random.Generator, batch_size: int) -> dict[str, np.ndarray]:
        return {"x": rng.standard_normal((self.n, self.n))}

    def forward_size(self, batch_size: int) -> ForwardSize:
        return _sized(0, self.n**2, self.n**2)

    def forward(self, ops, params: dict, x):
        return ops.reshape(self.method, x)

    def extra_metrics(self, ops, params: dict, inputs: dict, output) -> dict[str, float]:
        return {"copied": float(ops.data_pointer(output) != ops.data_pointer(inputs["x"]))}


def _sized(weights: int, inputs: int, outputs: int, flops: float | None = None) -> ForwardSize:
    """An op workload's call: one example, its input whole."""
    return ForwardSize(weights, inputs, outputs, examples=1, x_per_example=inputs, flops=flops)

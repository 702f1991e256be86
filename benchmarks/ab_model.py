"""The A/B workload: two methods whose work differs by a known 10%, for testing comparisons (BENCHMARKS.md).

`method=a` multiplies a batch by one n x n matrix `layers` times; `method=b` does `layers // 10` more of the
same multiplications (11 against 10 by default), so b's time is about 1.10x a's, the call's fixed cost aside.
The matrix is symmetric, so every backend's weight layout multiplies by the same matrix.
"""

from __future__ import annotations

import numpy as np

from runner.config import ConfigError, require_positive
from runner.models import Workload


class ChainAB(Workload):
    name = "ab"
    gradients = per_example_gradients = jacobian = None

    def __init__(self, n: int, layers: int, method: str):
        require_positive(n=n, layers=layers)
        if method not in ("a", "b"):
            raise ConfigError(f"model.method={method}: must be a or b")
        self.n, self.method = n, method
        self.steps = layers if method == "a" else layers + layers // 10

    def init_params(self, rng: np.random.Generator) -> dict[str, np.ndarray]:
        m = rng.standard_normal((self.n, self.n))
        return {"w": (m + m.T) / (2 * np.sqrt(self.n))}  # symmetric: the layout does not matter; norms stay put

    def make_inputs(self, rng: np.random.Generator, batch_size: int) -> dict[str, np.ndarray]:
        return {"x": rng.standard_normal((batch_size, self.n))}

    def examples_per_call(self, batch_size: int) -> int:
        return batch_size

    def forward(self, ops, params: dict, x):
        for _ in range(self.steps):
            x = ops.matmul(x, params["w"])
        return x


def true_ratio(backend_name: str, n: int, mode: str, pairs: int = 300) -> tuple[float, float]:
    """b's time over a's in one process, on the runner's own backend: blocks of 10 calls of each in alternation;
    (by their minima, by their medians)."""
    import time

    from runner.backends import load_backend

    backend = load_backend(f"runner.backends.{backend_name}_backend")
    rng = np.random.default_rng(0)
    calls = {}
    for method in ("a", "b"):
        model = ChainAB(n, 10, method)
        w = backend.asarray(model.init_params(rng)["w"], "cpu", "float32")
        x = backend.asarray(model.make_inputs(rng, 32)["x"], "cpu", "float32")
        step = backend.compile_step(lambda w, x, model=model: model.forward(backend, {"w": w}, x), mode, "cpu")
        calls[method] = lambda step=step, w=w, x=x: step(w, x)
    times: dict[str, list[float]] = {"a": [], "b": []}
    for index in range(pairs + 20):
        for method in ("a", "b") if index % 2 else ("b", "a"):
            start = time.perf_counter()
            for _ in range(10):
                calls[method]()
            if index >= 20:  # the first blocks warm up (compiling, caches)
                times[method].append(time.perf_counter() - start)
    a, b = np.array(times["a"]), np.array(times["b"])
    return float(b.min() / a.min()), float(np.median(b) / np.median(a))


if __name__ == "__main__":
    import argparse
    import os

    parser = argparse.ArgumentParser(description="The A/B workload's true b/a, in one process (BENCHMARKS.md).")
    parser.add_argument("--backend", default="numpy", help="numpy, jax, torch, tensorflow")
    parser.add_argument("--n", type=int, default=128, help="model.n")
    parser.add_argument("--mode", default="eager", help="mode (jax: function is jax.jit)")
    parser.add_argument("--pin", action="store_true", help="this process on its first CPU only (threads=1)")
    args = parser.parse_args()
    if args.pin:
        os.sched_setaffinity(0, sorted(os.sched_getaffinity(0))[:1])
    by_minima, by_medians = true_ratio(args.backend, args.n, args.mode)
    print(
        f"{args.backend} n={args.n} mode={args.mode}{' pinned' if args.pin else ''}: b/a {by_minima:.3f} by minima, "
        f"{by_medians:.3f} by medians"
    )

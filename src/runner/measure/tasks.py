"""Tasks (inference, gradients, jacobian) built from a backend's primitives, and their references.

A task yields results keyed by their tensors.h5 path ("outputs/y", "gradients/dense.weight",
"outputs/jacobian"), so recording and comparison never need to know which task ran.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from types import ModuleType

import numpy as np


@dataclass
class TaskRun:
    step: Callable[[], object]  # the call that is timed
    results: Callable[[object], dict[str, np.ndarray]]  # a step's output -> {h5 path: numpy array}


def build_task(
    backend: ModuleType,
    workload,
    task: str,
    mode: str,
    device: str,
    params: dict,
    inputs: dict,
    constants: dict | None = None,
    per_example: bool = False,
) -> TaskRun:
    """The timed call of `task` under `mode`, on arrays already placed on the device. Gradients are
    taken w.r.t. `params`, one set per example where the mode says so (`mode.per_example` in its yaml);
    `constants` (batch-norm statistics) enter the model but are not trained."""
    forward, loss = _bind_model(workload, backend, constants or {})
    x = inputs["x"]
    if task == "inference":
        step = _timed_call(backend, backend.compile_model(forward, mode, device), mode, device, params, x)
        return TaskRun(step, lambda out: {"outputs/y": backend.to_numpy(out)})
    if task == "gradients":
        loss = backend.compile_model(loss, mode, device)
        if per_example:
            fn = backend.per_example_grad(loss, mode, workload.gradients)
        else:
            fn = backend.grad(loss, workload.gradients)
        results = partial(_gradient_results, backend, per_example)
        step = _timed_call(backend, fn, mode, device, backend.trainable(params), x, inputs["labels"])
        return TaskRun(step, results)
    if task == "jacobian":
        fn = backend.batch_jacobian(backend.compile_model(forward, mode, device), mode, workload.jacobian)
        step = _timed_call(backend, fn, mode, device, params, x)
        return TaskRun(step, lambda out: {"outputs/jacobian": backend.to_numpy(out)})
    raise ValueError(f"unknown task {task!r}")


def _bind_model(workload, backend: ModuleType, constants: dict) -> tuple[Callable, Callable]:
    """forward(params, x) and loss(params, x, labels) on this backend, constants folded in."""
    if not constants:  # partial adds no Python frame: microsecond workloads time what timeit times
        loss = workload.loss  # op workloads have none
        return partial(workload.forward, backend), loss and partial(loss, backend)

    def forward(params: dict, x):
        return workload.forward(backend, {**params, **constants}, x)

    def loss(params: dict, x, labels):
        return workload.loss(backend, {**params, **constants}, x, labels)

    return forward, loss


def _timed_call(backend: ModuleType, fn: Callable, mode: str, device: str, params: dict, *args) -> Callable[[], object]:
    """fn compiled for `mode` with all its arguments bound: C-level partials, no extra Python frame.

    The weights are bound before compiling, as a model holds its weights: tf.function then captures
    them instead of flattening a dict argument on every call (BENCHMARKS.md, what this suite found).
    """
    return partial(backend.compile_step(partial(fn, params), mode, device), *args)


def _gradient_results(backend: ModuleType, per_example: bool, grads: dict) -> dict[str, np.ndarray]:
    return {
        f"gradients/{name}": backend.from_native_layout(backend.to_numpy(g), per_example) for name, g in grads.items()
    }


def forward_outputs(
    backend: ModuleType, workload, params: dict, inputs: dict, known: dict | None = None
) -> dict[str, np.ndarray]:
    """Untimed eager forward pass (and loss, where there are labels), for the record; skipped where the
    timed call's own output is `known` already (one more 40 s call for a 20000^2 matmul)."""
    known = known or {}
    if "outputs/y" in known and "labels" not in inputs:
        return {}
    results = {"outputs/y": backend.to_numpy(workload.forward(backend, params, inputs["x"]))}
    if "labels" in inputs:
        loss = workload.loss(backend, params, inputs["x"], inputs["labels"])
        results["outputs/loss"] = np.asarray(backend.to_numpy(loss))
    return results


def reference_results(workload, task: str, per_example: bool, params: dict, inputs: dict) -> dict[str, np.ndarray]:
    """The same results computed in float64 numpy: the reference every run is checked against."""
    from runner.backends import numpy_backend

    if not workload.numpy_reference:
        return {}
    params = {k: np.asarray(v, np.float64) for k, v in params.items()}
    inputs = {k: np.asarray(v, np.float64) for k, v in inputs.items()}
    x = inputs["x"]
    if task == "inference":
        return {"outputs/y": workload.forward(numpy_backend, params, x)}
    if task == "gradients":
        method = workload.per_example_gradients if per_example else workload.gradients
        if method is None:
            return {}
        return {f"gradients/{k}": v for k, v in method(params, x, inputs["labels"]).items()}
    if task == "jacobian" and workload.jacobian is not None:
        return {"outputs/jacobian": workload.jacobian(params, x)}
    return {}


def errors_vs_reference(results: dict[str, np.ndarray], reference: dict[str, np.ndarray]) -> dict[str, float]:
    """Largest absolute error over all compared tensors, and the largest error relative to each
    tensor's own largest reference magnitude (a max-norm relative error, stable near zeros)."""
    shared = [k for k in reference if k in results]
    if not shared:
        return {}
    for k in shared:
        if results[k].shape != reference[k].shape:
            raise ValueError(f"{k} has shape {results[k].shape}, the reference {reference[k].shape}")
    abs_errs = {k: float(np.max(np.abs(results[k].astype(np.float64) - reference[k]), initial=0.0)) for k in shared}
    rel_errs = [abs_errs[k] / max(float(np.max(np.abs(reference[k]), initial=0.0)), 1e-300) for k in shared]
    return {"max_abs_err_vs_reference": max(abs_errs.values()), "max_rel_err_vs_reference": max(rel_errs)}

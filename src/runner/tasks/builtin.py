"""The three tasks every workload with a loss runs: inference, gradients (also per example), jacobian."""

from __future__ import annotations

from functools import partial
from types import ModuleType
from typing import Any

import numpy as np

from runner.tasks import Setup, Task, TaskRun, backward_elements, float64, timed_call, with_workload_warnings


class Inference(Task):
    """One forward pass: outputs/y."""

    def build(self, setup: Setup) -> TaskRun:
        b = setup.backend
        forward, _ = setup.model()
        step = timed_call(b, b.compile_model(forward, setup.mode, setup.device), setup.mode, setup.device,
                          setup.params, setup.inputs["x"])  # fmt: skip
        return TaskRun(step, lambda out: {"outputs/y": b.to_numpy(out)}, with_workload_warnings(setup))

    def reference(self, setup: Setup, params: dict, inputs: dict) -> dict[str, np.ndarray]:
        from runner.backends import numpy_backend

        own = setup.workload.own_reference({"results": "outputs/y"}, params, inputs)
        if own is not None:
            return own
        return {"outputs/y": setup.workload.forward(numpy_backend, float64(params), float64(inputs)["x"])}


class Gradients(Task):
    """d loss / d weights: gradients/NAME, with a leading batch axis in a per-example mode."""

    per_example_modes = True
    like = "gradients"
    backward = True

    def build(self, setup: Setup) -> TaskRun:
        b, mode = setup.backend, setup.mode
        _, loss = setup.model()
        loss = b.compile_model(loss, mode, setup.device)
        if setup.per_example:
            fn = b.per_example_grad(loss, mode, setup.workload.gradients)
        else:
            fn = b.grad(loss, setup.workload.gradients)
        step = timed_call(
            b, fn, mode, setup.device, b.trainable(setup.params), setup.inputs["x"], setup.inputs["labels"]
        )
        return TaskRun(step, partial(_gradient_results, b, setup.per_example), with_workload_warnings(setup))

    def reference(self, setup: Setup, params: dict, inputs: dict) -> dict[str, np.ndarray]:
        own = setup.workload.own_reference({"results": "gradients", "per_example": setup.per_example}, params, inputs)
        if own is not None:
            return own
        workload = setup.workload
        method = workload.per_example_gradients if setup.per_example else workload.gradients
        if method is None:
            return {}
        inputs = float64(inputs)
        return {f"gradients/{k}": v for k, v in method(float64(params), inputs["x"], inputs["labels"]).items()}

    def array_elements(self, workload: Any, batch_size: int, per_example: bool) -> dict[str, int] | None:
        return gradient_elements(workload, batch_size, per_example)

    def flops(self, workload: Any, batch_size: int) -> float | None:
        return gradient_flops(workload, batch_size)


def gradient_elements(workload: Any, batch_size: int, per_example: bool) -> dict[str, int] | None:
    """A gradient's call: its results are the weights' size, once per example in a per-example mode."""
    size = workload.forward_size(batch_size)
    return size and backward_elements(size, size.weights * (batch_size if per_example else 1))


def gradient_flops(workload: Any, batch_size: int) -> float | None:
    """A forward and its backward pass, which costs about two forwards."""
    size = workload.forward_size(batch_size)
    return size and size.flops and 3 * size.flops


def _gradient_results(backend: ModuleType, per_example: bool, grads: dict) -> dict[str, np.ndarray]:
    return {
        f"gradients/{name}": backend.from_native_layout(backend.to_numpy(g), per_example) for name, g in grads.items()
    }


class Jacobian(Task):
    """d outputs / d inputs per example: outputs/jacobian, (batch, outputs, inputs)."""

    like = "jacobian"
    backward = True

    def build(self, setup: Setup) -> TaskRun:
        b, mode = setup.backend, setup.mode
        forward, _ = setup.model()
        fn = b.batch_jacobian(b.compile_model(forward, mode, setup.device), mode, setup.workload.jacobian)
        step = timed_call(b, fn, mode, setup.device, setup.params, setup.inputs["x"])
        return TaskRun(step, lambda out: {"outputs/jacobian": b.to_numpy(out)}, with_workload_warnings(setup))

    def reference(self, setup: Setup, params: dict, inputs: dict) -> dict[str, np.ndarray]:
        own = setup.workload.own_reference({"results": "outputs/jacobian"}, params, inputs)
        if own is not None:
            return own
        if setup.workload.jacobian is None:
            return {}
        return {"outputs/jacobian": setup.workload.jacobian(float64(params), float64(inputs)["x"])}

    def array_elements(self, workload: Any, batch_size: int, per_example: bool) -> dict[str, int] | None:
        """Each example's outputs by its inputs."""
        size = workload.forward_size(batch_size)
        return size and backward_elements(size, size.outputs * size.x_per_example)

    def flops(self, workload: Any, batch_size: int) -> float | None:
        """A forward and one backward pass (about two forwards) per output of an example."""
        size = workload.forward_size(batch_size)
        return size and size.flops and size.flops * (1 + 2 * size.outputs // size.examples)

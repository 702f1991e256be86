"""task=train_step: forward, loss, backward and the optimizer's update, the weights and the optimizer's state
carried from call to call; each backend writes the step as its users do (`Backend.train_step`).

Each timed call is one real step and nothing is reset between samples. The first call (tracing, compiling,
building the optimizer's state) is the record's first_call_s. Right after it, before any other timed call,
the step runs `checked_steps - 1` more times and the weights are read: trained/NAME in tensors.h5, checked
against the same steps in float64 NumPy from the same weights and batch (runner.backends.optimizers). The loss on
the batch before and after those steps is the record's loss_before and loss_after: whether training progressed.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from types import ModuleType
from typing import Any

import numpy as np

from runner.backends.optimizers import Optimizer
from runner.config import ConfigError
from runner.tasks import Setup, Task, TaskRun, float64, with_workload_warnings
from runner.tasks.builtin import gradient_elements, gradient_flops

# optimizer_convention (the record's environment), said: how the framework writes the update the step times
CONVENTION_SAID = {
    ("sgd", "torch"): "torch's convention, as torch.optim and optax write momentum: v = momentum·v + g, w −= lr·v",
    ("sgd", "keras"): "Keras's convention: v = momentum·v − lr·g, w += v (the same trajectory as torch's)",
    ("adam", "torch"): "torch's convention, as torch.optim and optax write Adam: w −= lr·m̂/(√v̂ + eps)",
    ("adam", "keras"): (
        "Keras's convention: w −= lr·√(1−beta2^t)/(1−beta1^t)·m/(√v + eps), Kingma and Ba's epsilon hat, "
        "so eps weighs differently in the first steps than in torch's"
    ),
}


class TrainStep(Task):
    like = "gradients"
    unit = "a step"
    backward = True

    def __init__(self, name: str, optimizer: dict, checked_steps: int = 10):
        super().__init__(name)
        self.optimizer = Optimizer.of(optimizer)
        if checked_steps < 1:
            raise ConfigError(f"task.checked_steps={checked_steps}: must be a positive integer")
        self.checked_steps = checked_steps
        self.losses: dict[str, float] = {}  # loss_before, loss_after: read by the checked steps (build's `trained`)

    @classmethod
    def page_lines(cls, config: dict, metrics: dict, environment: dict, seconds: Callable[[float], str]) -> list[str]:
        """The optimizer with its settings and its convention in words (environment's optimizer_convention), and the
        loss on the batch before and after the checked steps (whether training progressed)."""
        task, optimizer = config.get("task") or {}, (config.get("task") or {}).get("optimizer")
        if not isinstance(optimizer, dict):
            return []
        settings = ", ".join(f"{k} {v}" for k, v in optimizer.items() if k != "name")
        line = f"optimizer {optimizer.get('name')} ({settings})"
        convention = environment.get("optimizer_convention")
        said = CONVENTION_SAID.get((str(optimizer.get("name")), str(convention)))
        if said:
            line += f"; optimizer_convention {convention}: {said}"
        lines = [line]
        if "loss_before" in metrics and "loss_after" in metrics:
            before, after = metrics["loss_before"], metrics["loss_after"]
            steps = task.get("checked_steps", "the checked")
            lines.append(f"loss on the batch {before:.4g} before training, {after:.4g} after {steps} steps")
        return lines

    def build(self, setup: Setup) -> TaskRun:
        b, scale = setup.backend, _per_label(setup.inputs["labels"])
        _, total = setup.model()

        def loss(params: dict, x, labels):
            return total(params, x, labels) * scale

        backprop = setup.workload.gradients and partial(_scaled, setup.workload.gradients, scale)
        step, weights = _owner(setup).train_step(loss, setup.params, self.optimizer, setup.mode, setup.device, backprop)
        x, labels = setup.inputs["x"], setup.inputs["labels"]
        timed = partial(step, x, labels)
        self.losses = {}

        def trained(first_output: object) -> dict[str, np.ndarray]:
            for _ in range(self.checked_steps - 1):
                timed()
            now = weights()
            before, after = loss(setup.params, x, labels), loss(now, x, labels)  # untimed, eager
            self.losses = {"loss_before": _value(b, before), "loss_after": _value(b, after)}
            # a copy: torch on the CPU hands out a view of the live weights
            return {f"trained/{k}": np.array(b.from_native_layout(b.to_numpy(v))) for k, v in now.items()}

        return TaskRun(timed, trained, with_workload_warnings(setup, partial(_diverged, b, weights, self)))

    def array_elements(self, workload: Any, batch_size: int, per_example: bool) -> dict[str, int] | None:
        return gradient_elements(workload, batch_size, per_example)

    def flops(self, workload: Any, batch_size: int) -> float | None:
        return gradient_flops(workload, batch_size)

    def reference(self, setup: Setup, held: dict, inputs: dict) -> dict[str, np.ndarray]:
        request = {"results": "trained", "optimizer": vars(self.optimizer), "steps": self.checked_steps}
        own = setup.workload.own_reference(request, held, inputs)
        if own is not None:
            return own
        backprop = setup.workload.gradients
        if backprop is None:
            return {}
        params = float64({k: v for k, v in held.items() if k in setup.params})
        constants, inputs = float64({k: v for k, v in held.items() if k not in setup.params}), float64(inputs)
        convention = _owner(setup).OPTIMIZER_CONVENTION
        state, backprop = self.optimizer.init(params), partial(_scaled, backprop, _per_label(inputs["labels"]))
        for _ in range(self.checked_steps):
            grads = backprop({**params, **constants}, inputs["x"], inputs["labels"])
            params, state = self.optimizer.update(params, grads, state, np.sqrt, convention)
        return {f"trained/{k}": v for k, v in params.items()}

    def metrics(self, call_s: float, samples: dict[str, list]) -> dict[str, float]:
        """Steps per second, and the loss on the batch before and after the checked steps (where finite: a diverged
        step's NaN is said in the warnings)."""
        finite = {k: v for k, v in self.losses.items() if np.isfinite(v)}
        return {"steps_per_s": 1.0 / call_s, **finite}

    def describe(self, setup: Setup) -> dict[str, str]:
        owner = _owner(setup)
        how = owner.TRAIN_STEP_COMPILED.get(setup.mode)
        return {"optimizer_convention": owner.OPTIMIZER_CONVENTION, **({"train_step_compiled": how} if how else {})}


def _owner(setup: Setup) -> Any:
    """Who writes the training step: the workload where it trains through its own API (model=keras:
    train_on_batch, on every Keras backend), else the backend; its OPTIMIZER_CONVENTION is the reference's, its
    TRAIN_STEP_COMPILED what the record says of each mode (both declared by every backend and every workload)."""
    return setup.workload if setup.workload.train_step is not None else setup.backend


def _per_label(labels: Any) -> float:
    """The step minimizes the workload's loss per label element (a mean squared error, not the sum the gradients
    task differentiates), as trainers do: one learning rate then serves every batch and model size."""
    return 1.0 / int(np.prod(labels.shape))


def _scaled(backprop: Callable, scale: float, params: dict, x: Any, labels: Any) -> dict:
    return {k: g * scale for k, g in backprop(params, x, labels).items()}


def _value(backend: ModuleType, loss: Any) -> float:
    """A loss as a Python float (a torch loss off its graph first)."""
    return float(np.asarray(backend.to_numpy(loss), np.float64))


def _diverged(backend: ModuleType, weights: Callable[[], dict], task: TrainStep) -> list[str]:
    """Training that diverged computes on NaN and inf, at speeds of their own: say so, with the loss where the
    checked steps already left it NaN or inf."""
    losses = task.losses
    said = []
    if losses and not all(np.isfinite(v) for v in losses.values()):
        said.append(
            f"the training diverged in its first {task.checked_steps} steps: the loss went from "
            f"{losses['loss_before']:.4g} to {losses['loss_after']:.4g} (lower optimizer.lr)"
        )
    bad = [k for k, v in weights().items() if not np.isfinite(backend.to_numpy(v)).all()]
    if bad:
        said.append(f"the training diverged while timed: {', '.join(bad)} hold NaN or inf (lower optimizer.lr)")
    return said

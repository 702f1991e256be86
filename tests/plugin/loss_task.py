"""A task for tests: the loss's value alone (a forward pass and the loss, nothing differentiated).

It shows what a new task takes: this class and conf/task/loss_value.yaml.
"""

from __future__ import annotations

import numpy as np

from runner.tasks import Setup, Task, TaskRun, float64, timed_call


class LossValue(Task):
    like = "gradients"  # it needs a loss: it runs on the models that take task=gradients

    def build(self, setup: Setup) -> TaskRun:
        b = setup.backend
        _, loss = setup.model()
        step = timed_call(b, b.compile_model(loss, setup.mode, setup.device), setup.mode, setup.device,
                          setup.params, setup.inputs["x"], setup.inputs["labels"])  # fmt: skip
        return TaskRun(step, lambda out: {"outputs/loss_value": np.asarray(b.to_numpy(out))})

    def reference(self, setup: Setup, params: dict, inputs: dict) -> dict[str, np.ndarray]:
        from runner.backends import numpy_backend

        inputs = float64(inputs)
        value = setup.workload.loss(numpy_backend, float64(params), inputs["x"], inputs["labels"])
        return {"outputs/loss_value": np.asarray(value)}

"""The optimizers of task=train_step, as settings every backend reads, and written out in array arithmetic.

The written-out update is the NumPy and tf.experimental.numpy training step, and, in float64, the reference
every backend's step is checked against. Frameworks define Adam in two ways, and the reference follows each:

- `torch` (torch.optim.Adam, optax.adam; NumPy and tnp here): m/(1-b1^t) / (sqrt(v/(1-b2^t)) + eps);
- `keras` (keras.optimizers.Adam): lr * sqrt(1-b2^t)/(1-b1^t) * m / (sqrt(v) + eps), Kingma and Ba's
  "epsilon hat", so the same `eps` weighs differently early on.

SGD with momentum is the same trajectory in all of them (torch and optax: v = momentum * v + g, w -= lr * v;
Keras: v = momentum * v - lr * g, w += v), written out here as torch writes it, and as Keras for `keras`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any

from runner.config import ConfigError

CONVENTIONS = ("torch", "keras")


@dataclass(frozen=True)
class Optimizer:
    """conf/optimizer/NAME.yaml: `name` (sgd or adam) and its settings."""

    name: str
    lr: float
    momentum: float = 0.0  # sgd
    beta1: float = 0.9  # adam
    beta2: float = 0.999
    eps: float = 1e-8

    @classmethod
    def of(cls, settings: dict) -> Optimizer:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(settings) - known)
        if unknown:
            raise ConfigError(f"optimizer has no setting {', '.join(unknown)} (settings: {', '.join(sorted(known))})")
        optimizer = cls(**settings)
        if optimizer.name not in ("sgd", "adam"):
            raise ConfigError(f"optimizer.name={optimizer.name}: must be sgd or adam")
        if not optimizer.lr > 0 or not 0 <= optimizer.momentum < 1 or not optimizer.eps > 0:
            raise ConfigError("optimizer: lr and eps must be > 0, momentum from 0 up to (not including) 1")
        if not (0 <= optimizer.beta1 < 1 and 0 <= optimizer.beta2 < 1):
            raise ConfigError("optimizer: beta1 and beta2 must be from 0 up to (not including) 1")
        return optimizer

    def init(self, params: dict) -> dict:
        """The optimizer's state for these weights: zeros shaped like them, and Adam's step count."""
        if self.name == "sgd":
            return {"velocity": {k: p * 0 for k, p in params.items()}}
        first = next(iter(params.values()))
        zeros = {k: p * 0 for k, p in params.items()}
        # the step count as an array of the weights' kind: a compiled step (tf.function) takes it as an input
        return {"m": zeros, "v": dict(zeros), "t": first[(0,) * len(first.shape)] * 0}

    def update(
        self, params: dict, grads: dict, state: dict, sqrt: Callable[[Any], Any], convention: str = "torch"
    ) -> tuple[dict, dict]:
        """One step: (new weights, new state), in the array type of `params` (sqrt: its square root); `grads` may
        hold more than the weights trained (the gradients of constants are not applied)."""
        if self.name == "sgd":
            return self._sgd(params, grads, state, convention)
        return self._adam(params, grads, state, sqrt, convention)

    def _sgd(self, params: dict, grads: dict, state: dict, convention: str) -> tuple[dict, dict]:
        velocity = {}
        if convention == "keras":
            velocity = {k: self.momentum * state["velocity"][k] - self.lr * grads[k] for k in params}
            return {k: params[k] + velocity[k] for k in params}, {"velocity": velocity}
        velocity = {k: self.momentum * state["velocity"][k] + grads[k] for k in params}
        return {k: params[k] - self.lr * velocity[k] for k in params}, {"velocity": velocity}

    def _adam(self, params: dict, grads: dict, state: dict, sqrt: Callable, convention: str) -> tuple[dict, dict]:
        t = state["t"] + 1
        m = {k: self.beta1 * state["m"][k] + (1 - self.beta1) * grads[k] for k in params}
        v = {k: self.beta2 * state["v"][k] + (1 - self.beta2) * grads[k] * grads[k] for k in params}
        c1, c2 = 1 - self.beta1**t, 1 - self.beta2**t
        if convention == "keras":
            step = self.lr * c2**0.5 / c1
            new = {k: params[k] - step * m[k] / (sqrt(v[k]) + self.eps) for k in params}
        else:
            new = {k: params[k] - self.lr * (m[k] / c1) / (sqrt(v[k] / c2) + self.eps) for k in params}
        return new, {"m": m, "v": v, "t": t}


def written_out_step(
    gradients: Callable, params: dict, optimizer: Optimizer, sqrt: Callable, compile_step: Callable
) -> tuple[Callable, Callable[[], dict]]:
    """A training step from a gradient function and the written-out update, the state carried in a closure:
    (step(x, labels), weights()). `compile_step` wraps the pure update (tf.function for tnp's compiled modes)."""

    def pure(params: dict, state: dict, x, labels) -> tuple[dict, dict]:
        return optimizer.update(params, gradients(params, x, labels), state, sqrt)

    update = compile_step(pure)
    held = {"params": dict(params), "state": optimizer.init(params)}

    def step(x, labels) -> None:
        held["params"], held["state"] = update(held["params"], held["state"], x, labels)

    return step, lambda: held["params"]


def keras_optimizer(keras: Any, optimizer: Optimizer, dtype: str) -> Any:
    """keras.optimizers.SGD or Adam for weights of `dtype`, on any Keras backend, float64-exact for float64 weights.

    Keras makes the learning rate a variable of its floatx (float32 unless set): it is built with floatx set to
    `dtype`. Keras casts momentum and the betas with ops.cast of a Python float, which on TensorFlow goes through a
    float32 tensor (0.9 -> 0.8999999762): float64 numbers (a float subclass, which Keras's checks accept) are cast
    exactly. For float32 weights they stay Python floats, so no float64 arithmetic enters the step."""
    import numpy as np

    exact = np.float64 if dtype == "float64" else float
    floatx = keras.config.floatx()
    keras.config.set_floatx(dtype)
    try:
        if optimizer.name == "sgd":
            return keras.optimizers.SGD(learning_rate=optimizer.lr, momentum=exact(optimizer.momentum))
        betas = {"beta_1": exact(optimizer.beta1), "beta_2": exact(optimizer.beta2)}
        return keras.optimizers.Adam(learning_rate=optimizer.lr, epsilon=optimizer.eps, **betas)
    finally:
        keras.config.set_floatx(floatx)

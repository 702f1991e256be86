"""The hand-written side of parity.py's training-step rows: one step of the MLP (32 -> 64 + bias -> relu -> 2) on a
mean-squared-error loss with SGD (lr 0.01, momentum 0.9), written as each framework's users write it.

What the runner runs as `task=train_step model=mlp optimizer=sgd`: the same loss (the workload's sum of squares
per label element), the same optimizer and settings.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

BATCH, LR, MOMENTUM = 32, 0.01, 0.9
ROWS = ("mlp_train_step_eager", "mlp_train_step_compiled")
Loops = dict[str, list[tuple[str, Callable[[], object]]]]


def _data(rng: np.random.Generator) -> tuple[np.ndarray, ...]:
    return tuple(rng.standard_normal(s).astype(np.float32) for s in ((BATCH, 32), (BATCH, 2)))


def torch_train_loops(device: str) -> Loops:
    import torch
    import torch.nn.functional as F

    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 2, bias=False)).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    x, t = (torch.from_numpy(a).to(device) for a in _data(np.random.default_rng(0)))

    def step(x, t):
        optimizer.zero_grad(set_to_none=True)
        loss = F.mse_loss(model(x), t)
        loss.backward()
        optimizer.step()
        return loss.detach()

    compiled = torch.compile(step)
    return {
        "mlp_train_step_eager": [("nn.Sequential + torch.optim.SGD", lambda: step(x, t))],
        "mlp_train_step_compiled": [("torch.compile(the whole step)", lambda: compiled(x, t))],
    }


def tensorflow_train_loops(device: str) -> Loops:
    import keras
    import tensorflow as tf

    rng = np.random.default_rng(0)
    w1, b, w2 = (tf.Variable(rng.standard_normal(s).astype(np.float32)) for s in ((32, 64), (64,), (64, 2)))
    variables = [w1, b, w2]
    optimizer = keras.optimizers.SGD(learning_rate=LR, momentum=MOMENTUM)
    x, t = (tf.constant(a) for a in _data(rng))

    def step(x, t):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(tf.matmul(tf.nn.relu(tf.matmul(x, w1) + b), w2) - t))
        optimizer.apply_gradients(zip(tape.gradient(loss, variables), variables, strict=True))
        return loss

    compiled = tf.function(step)
    return {
        "mlp_train_step_eager": [("tf.Variable + GradientTape + keras SGD", lambda: step(x, t))],
        "mlp_train_step_compiled": [("tf.function(the whole step)", lambda: compiled(x, t))],
    }


def jax_train_loops(device: str) -> Loops:
    import functools

    import jax
    import jax.numpy as jnp
    import optax

    rng = np.random.default_rng(0)
    on = jax.devices("gpu" if device == "cuda" else "cpu")[0]
    shapes = (("w1", (32, 64)), ("b", (64,)), ("w2", (64, 2)))
    held = {"params": {k: jax.device_put(rng.standard_normal(s).astype(np.float32), on) for k, s in shapes}}
    x, t = (jax.device_put(a, on) for a in _data(rng))
    optimizer = optax.sgd(LR, momentum=MOMENTUM)
    held["state"] = optimizer.init(held["params"])

    def loss(w, x, t):
        return jnp.mean(jnp.square(jax.nn.relu(x @ w["w1"] + w["b"]) @ w["w2"] - t))

    def update(params, state, x, t):
        value, grads = jax.value_and_grad(loss)(params, x, t)
        updates, state = optimizer.update(grads, state, params)
        return optax.apply_updates(params, updates), state, value

    def step(update):
        held["params"], held["state"], value = update(held["params"], held["state"], x, t)
        return jax.block_until_ready((held["params"], value))

    jitted = jax.jit(update, donate_argnums=(0, 1))
    return {
        "mlp_train_step_eager": [("optax.sgd, op by op", functools.partial(step, update))],
        "mlp_train_step_compiled": [("jax.jit(update, donate_argnums=(0, 1))", functools.partial(step, jitted))],
    }

"""model=keras's float64 reference: the same model, weights and inputs in float64 on Keras's TensorFlow backend, the
one Keras backend that keeps float64, in a process of its own (one process holds one Keras backend):
`python -m runner.models.keras_reference FOLDER`, FOLDER holding request.json and arrays.npz, results.npz out."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from runner.backends.optimizers import Optimizer, keras_optimizer
from runner.models.keras_apps import REFERENCE_BACKEND, build_application, import_keras, variable_names

RESULTS = ("outputs/y", "gradients", "trained")  # what it computes: a task's request (runner.tasks) names one


def compute(request: dict[str, Any], params: dict, inputs: dict) -> tuple[dict[str, np.ndarray], str | None]:
    """The task's results in float64 (request: the task's, with the model's arch and image_size), and why there are
    none where the process failed."""
    arrays: dict[str, Any] = {f"params/{k}": np.asarray(v, np.float64) for k, v in params.items()}
    arrays.update({f"inputs/{k}": np.asarray(v, np.float64) for k, v in inputs.items()})
    with tempfile.TemporaryDirectory(prefix="keras-reference-") as folder:
        np.savez(Path(folder, "arrays.npz"), **arrays)
        Path(folder, "request.json").write_text(json.dumps(request))
        done = subprocess.run(
            [sys.executable, "-m", "runner.models.keras_reference", folder],
            env=_reference_env(),
            capture_output=True,
            text=True,
        )
        if done.returncode != 0:
            last = (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1]
            return {}, f"no reference: the float64 Keras run on {REFERENCE_BACKEND} failed ({last[:300]})"
        with np.load(Path(folder, "results.npz")) as results:
            return {k: results[k] for k in results.files}, None


def _reference_env() -> dict[str, str]:
    """Keras on TensorFlow, on the CPU (the run's GPU memory stays the run's; float64 on the CPU, as numpy's
    reference is), finding this runner first."""
    source = str(Path(__file__).resolve().parents[2])
    path = os.pathsep.join(p for p in (source, os.environ.get("PYTHONPATH", "")) if p)
    quiet = {"TF_CPP_MIN_LOG_LEVEL": "2", "CUDA_VISIBLE_DEVICES": ""}
    return {**os.environ, **quiet, "KERAS_BACKEND": REFERENCE_BACKEND, "PYTHONPATH": path}


def compute_reference(folder: Path) -> None:
    """FOLDER/request.json and arrays.npz in, FOLDER/results.npz out: the task's results in float64 on Keras's
    TensorFlow backend, as the run computes them (stateless_call for outputs and gradients, Keras's train_on_batch
    for trained weights)."""
    request = json.loads((folder / "request.json").read_text())
    with np.load(folder / "arrays.npz") as stored:
        arrays: dict[str, Any] = {k: stored[k] for k in stored.files}
    keras = import_keras(REFERENCE_BACKEND)
    keras.config.set_floatx("float64")
    keras.config.set_dtype_policy("float64")
    model = build_application(keras, request["arch"], request["image_size"])
    trainable_names, other_names = variable_names(model)
    x = arrays["inputs/x"].transpose(0, 2, 3, 1)
    labels: Any = arrays.get("inputs/labels")  # None for outputs alone
    if request["results"] == "trained":
        results = _reference_training(keras, model, trainable_names, arrays, x, labels, request)
    else:
        import tensorflow as tf

        trainable = [tf.constant(arrays[f"params/{n}"]) for n in trainable_names]
        fixed = [v.value for v in model.non_trainable_variables]
        others = [
            tf.constant(arrays[f"params/{n}"]) if f"params/{n}" in arrays else v
            for n, v in zip(other_names, fixed, strict=True)
        ]

        def forward(x):
            return model.stateless_call(trainable, others, x, training=False)[0]

        if request["results"] == "outputs/y":
            results = {"outputs/y": forward(x).numpy()}
        else:

            def gradients(x, labels) -> list[np.ndarray]:
                with tf.GradientTape() as tape:
                    tape.watch(trainable)
                    loss = tf.reduce_sum(tf.square(forward(x) - labels))
                return [g.numpy() for g in tape.gradient(loss, trainable)]

            if request["per_example"]:
                each = [gradients(x[i : i + 1], labels[i : i + 1]) for i in range(len(x))]
                grads = [np.stack(g) for g in zip(*each, strict=True)]
            else:
                grads = gradients(x, labels)
            results = {f"gradients/{n}": g for n, g in zip(trainable_names, grads, strict=True)}
    np.savez(folder / "results.npz", **results)


def _reference_training(keras, model, names: list[str], arrays: dict, x, labels, request: dict) -> dict:
    """KerasModel.train_step's steps: the trainable weights assigned (batch-norm statistics keep Keras's initial
    values: train_on_batch normalizes with the batch's), Keras's optimizer and mean squared error, tf.function."""
    for name, variable in zip(names, model.trainable_variables, strict=True):
        variable.assign(arrays[f"params/{name}"])
    optimizer = keras_optimizer(keras, Optimizer(**request["optimizer"]), "float64")
    model.compile(optimizer, "mean_squared_error", jit_compile=False)
    for _ in range(request["steps"]):
        model.train_on_batch(x, labels)
    return {f"trained/{n}": np.asarray(v.numpy()) for n, v in zip(names, model.trainable_variables, strict=True)}


if __name__ == "__main__":
    compute_reference(Path(sys.argv[1]))

"""task=train_step: each backend's training step, after task.checked_steps steps (10), agrees with the same steps
in float64 NumPy (runner.backends.optimizers) from the same weights and batch; the default set runs a few cases,
the compiled grid is marked slow."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from functools import partial
from pathlib import Path

import h5py
import numpy as np
import pytest
from helpers import FAST_TIMING, run_cli

from runner.backends import load_backend
from runner.backends.optimizers import Optimizer
from runner.measure.job import run_and_record
from runner.record.naming import job_spec

TOLERANCE = {"float32": 1e-5, "float64": 1e-9}  # relative to each tensor's largest reference magnitude
MODES = {"numpy": ["eager"], "torch": ["eager", "function", "xla"]}
MODES["tensorflow"] = MODES["tnp"] = ["eager", "function", "xla"]
# (backend, mode, dtype, optimizer) run by default: every backend eagerly, both dtypes and optimizers somewhere,
# one compiled case; the rest of the grid is slow (torch.compile alone takes tens of seconds a case).
DEFAULT = {
    ("numpy", "eager", "float64", "adam"),
    ("numpy", "eager", "float32", "sgd"),
    ("torch", "eager", "float32", "adam"),
    ("torch", "eager", "float64", "sgd"),
    ("tensorflow", "eager", "float64", "adam"),
    ("tensorflow", "eager", "float32", "sgd"),
    ("tnp", "eager", "float32", "adam"),
    ("tnp", "function", "float64", "sgd"),
}


def grid() -> list:
    return [
        pytest.param(case, id="-".join(case), marks=[] if case in DEFAULT else [pytest.mark.slow])
        for backend, modes in MODES.items()
        for case in ((backend, m, d, o) for m in modes for d in TOLERANCE for o in ("sgd", "adam"))
    ]


def train(make_config, tmp_path, *overrides: str):
    cfg = make_config("tracking=none", "task=train_step", "timing.max_time_s=0.05", *overrides)
    outcome = run_and_record(job_spec(cfg), tmp_path)
    assert outcome.status == "FINISHED", outcome.error
    with h5py.File(tmp_path / "tensors.h5", "r") as f:
        trained = {name: f[f"trained/{name}"][()] for name in f["trained"]}
        initial = {name: f[f"weights/{name}"][()] for name in trained} if "weights" in f else {}
    return outcome, trained, initial


@pytest.mark.parametrize("case", grid())
def test_mlp_training_agrees_with_float64_reference(make_config, tmp_path, case):
    backend, mode, dtype, optimizer = case
    outcome, trained, initial = train(
        make_config, tmp_path, f"backend={backend}", f"mode={mode}", f"dtype={dtype}", f"optimizer={optimizer}"
    )
    assert set(trained) == {"dense.weight", "dense.bias", "proj.weight"}
    assert all(np.abs(trained[k] - initial[k]).max() > 1e-4 for k in trained), "the steps did not move the weights"
    assert outcome.metrics["max_rel_err_vs_reference"] < TOLERANCE[dtype]
    # the record says training progressed: the loss on the batch fell over the checked steps
    assert 0 < outcome.metrics["loss_after"] < outcome.metrics["loss_before"]


def test_loss_before_is_the_same_on_every_backend_and_a_diverged_run_says_so(make_config, tmp_path):
    """loss_before is the loss at the shared initial weights (float64: one number on every backend); a learning rate
    that blows the weights up records no NaN loss and says, in words, that the training diverged."""
    before = {
        backend: train(make_config, tmp_path / backend, f"backend={backend}", "dtype=float64")[0].metrics["loss_before"]
        for backend in ("numpy", "torch")
    }
    assert before["torch"] == pytest.approx(before["numpy"], rel=1e-12)
    outcome, _, _ = train(make_config, tmp_path / "diverged", "backend=numpy", "optimizer.lr=1e30")
    assert "loss_after" not in outcome.metrics and outcome.metrics["loss_before"] > 0
    said = " ".join(outcome.warnings)
    assert "the training diverged in its first 10 steps: the loss went from" in said and "lower optimizer.lr" in said


def _quadratic_loss(ops, params: dict, x, labels):
    return ops.sum(ops.square(params["w"] * x - labels))


def _quadratic_backprop(params: dict, x: np.ndarray, labels: np.ndarray) -> dict:
    return {"w": 2 * (params["w"] * x - labels) * x}


def test_keras_reference_is_keras_adam_not_torch_adam():
    """tensorflow's step (keras.optimizers.Adam) follows the written-out `keras` formula in float64 and not the
    `torch` one: a large eps, where the two differ most (Kingma and Ba's epsilon hat)."""
    tf_backend = load_backend("runner.backends.tensorflow_backend")
    assert tf_backend.OPTIMIZER_CONVENTION == "keras"
    optimizer = Optimizer.of({"name": "adam", "lr": 0.1, "eps": 0.1, "beta1": 0.8, "beta2": 0.95})
    rng = np.random.default_rng(0)
    w, x, labels = rng.standard_normal(6), rng.standard_normal(6), rng.standard_normal(6)
    as_tf = partial(tf_backend.asarray, device="cpu", dtype="float64")
    step, weights = tf_backend.train_step(
        partial(_quadratic_loss, tf_backend), {"w": as_tf(w)}, optimizer, "eager", "cpu", None
    )
    written = {convention: ({"w": w}, optimizer.init({"w": w})) for convention in ("keras", "torch")}
    for _ in range(5):
        step(as_tf(x), as_tf(labels))
        for convention, (params, state) in written.items():
            written[convention] = optimizer.update(
                params, _quadratic_backprop(params, x, labels), state, np.sqrt, convention
            )
    got = weights()["w"].numpy()
    np.testing.assert_allclose(got, written["keras"][0]["w"], rtol=1e-13, atol=0)
    assert np.abs(got - written["torch"][0]["w"]).max() > 1e-4


def test_tnp_compiled_step_traces_once():
    """tnp's written-out update in tf.function takes Adam's step count as an array: ten steps, one trace."""
    tnp_backend = load_backend("runner.backends.tnp_backend")
    tnp_backend.prepare("cpu", "float32")
    traced = []

    def loss(params: dict, x, labels):
        traced.append(1)  # Python runs at tracing only, in tf.function
        return _quadratic_loss(tnp_backend, params, x, labels)

    optimizer = Optimizer.of({"name": "adam", "lr": 0.01})
    ones = tnp_backend.asarray(np.ones(4), "cpu", "float32")
    step, weights = tnp_backend.train_step(loss, {"w": ones}, optimizer, "function", "cpu", None)
    for _ in range(10):
        step(ones, ones * 2)
    assert len(traced) == 1
    assert float(weights()["w"].numpy()[0]) == pytest.approx(1 + 10 * 0.01, rel=1e-3)  # Adam: lr a step, uphill


@pytest.mark.slow
def test_vision_training_agrees_between_torch_and_tensorflow(make_config, tmp_path):
    """resnet18 has no NumPy backprop, so no float64 reference: torch (torch.optim.SGD) and TensorFlow
    (keras.optimizers.SGD, the same trajectory) start from the same weights and must end at the same ones."""
    from runner.models import build_workload, initial_weights

    overrides = ["model=resnet18", "data.image_size=32", "batch_size=2", "dtype=float64", "optimizer=sgd"]
    overrides += ["optimizer.lr=0.05", "task.checked_steps=3"]
    runs = {b: train(make_config, tmp_path / b, f"backend={b}", *overrides)[1] for b in ("torch", "tensorflow")}
    cfg = make_config("task=train_step", *overrides)
    initial = initial_weights(cfg.model, build_workload(cfg.model), np.random.default_rng(cfg.seed))
    assert set(runs["torch"]) == set(runs["tensorflow"]) and "conv1.weight" in runs["torch"]
    assert max(np.abs(runs["torch"][k] - initial[k]).max() for k in runs["torch"]) > 1e-3, "the weights did not move"
    for name, value in runs["torch"].items():
        scale = np.abs(value).max()
        np.testing.assert_allclose(runs["tensorflow"][name], value, rtol=0, atol=1e-9 * scale, err_msg=name)


KERAS_TRAINING = ["model=keras", "model.arch=MobileNetV2", "data.image_size=64", "batch_size=8", "task=train_step"]
KERAS_TRAINING += ["optimizer.lr=0.001", "task.checked_steps=5", "tracking=none"]
KERAS_INITIAL = """
import sys
import numpy as np
from runner.config import compose
from runner.models import build_workload, initial_weights
cfg = compose(sys.argv[2:])
np.savez(sys.argv[1], **initial_weights(cfg.model, build_workload(cfg.model), np.random.default_rng(cfg.seed)))
"""


def _trained(run_dir: Path) -> dict[str, np.ndarray]:
    found: dict[str, np.ndarray] = {}
    with h5py.File(run_dir / "tensors.h5", "r") as f:
        f["trained"].visititems(
            lambda name, item: found.update({name: item[()]}) if isinstance(item, h5py.Dataset) else None
        )
    return found


@pytest.mark.slow  # three processes importing Keras on three frameworks, and one drawing the weights
def test_keras_train_on_batch_agrees_on_tensorflow_torch_and_jax(tmp_path):
    """model=keras trains through model.train_on_batch (Keras's optimizer, its compiled loss) on each Keras backend:
    from the same weights, five steps end at the same weights (float32, batch normalization on the batch's
    statistics: the tolerance of the Keras gradient tests)."""
    modes = {"tensorflow": "eager", "torch": "eager", "jax": "function"}  # JAX op by op compiles every op: minutes
    runs = {}
    for backend, mode in modes.items():
        run_dir = tmp_path / backend
        out = run_cli(
            f"backend={backend}", f"mode={mode}", *KERAS_TRAINING, f"hydra.run.dir={run_dir}", *FAST_TIMING, timeout=900
        )
        assert out.returncode == 0, out.stderr[-3000:]
        saved = json.loads((run_dir / "result.json").read_text())
        environment, metrics = saved["environment"], saved["metrics"]
        assert environment["optimizer_convention"] == "keras" and "train_on_batch" in environment["train_step_compiled"]
        # the reference: the same five steps in float64 on Keras's TensorFlow backend
        assert metrics["max_rel_err_vs_reference"] <= 1e-3, (backend, metrics["max_rel_err_vs_reference"])
        assert metrics["loss_before"] > 0 and metrics["loss_after"] > 0  # Keras's forward pass, inference mode
        runs[backend] = _trained(run_dir)
    initial_file = tmp_path / "initial.npz"
    command = [sys.executable, "-c", KERAS_INITIAL, str(initial_file), "backend=tensorflow", *KERAS_TRAINING]
    subprocess.run(
        command, check=True, timeout=600, env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[1] / "src")}
    )
    initial = dict(np.load(initial_file))
    on_tf = runs["tensorflow"]
    assert set(on_tf) == set(runs["torch"]) == set(runs["jax"]) and on_tf["Conv1/kernel"].shape == (3, 3, 3, 32)
    moved = max(np.abs(on_tf[k] - initial[k]).max() / np.abs(initial[k]).max() for k in on_tf)
    assert moved > 3e-3, "the steps moved the weights too little to tell a backend that did not step"
    for backend in ("torch", "jax"):
        for name, value in on_tf.items():
            assert np.abs(runs[backend][name] - value).max() <= 1e-3 * np.abs(value).max(), (backend, name)

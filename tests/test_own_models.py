"""Own models: any torchvision classifier on torch, any Keras application on TensorFlow and torch with the same
weights, and a user's workload from a folder outside the repository (examples/own_model)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest
from helpers import FAST_TIMING, compose_config, run_cli

from runner.config import PROJECT_ROOT, ConfigError, check_combination
from runner.measure.job import run_and_record
from runner.record.naming import job_spec

EXAMPLE = PROJECT_ROOT / "examples" / "own_model"
SMALL = ("data.image_size=64", "batch_size=2", "tracking=none")


def _outputs(run_dir: Path, key: str = "outputs/y") -> np.ndarray:
    with h5py.File(run_dir / "tensors.h5", "r") as f:
        return f[key][()]


# -- torchvision -----------------------------------------------------------------------------------


@pytest.mark.parametrize("arch", ["mobilenet_v3_small", "squeezenet1_1"])
def test_torchvision_arch_beyond_the_built_in_ones_predicts_as_its_module(arch, tmp_path):
    import torch
    import torchvision

    cfg = compose_config("backend=torch", "model=torchvision", f"model.arch={arch}", "task=inference", *SMALL)
    result = run_and_record(job_spec(cfg.copy()), tmp_path)
    assert result.status == "FINISHED", result.error
    assert len(result.predictions) == 2 and all(len(top) == 5 for top in result.predictions)
    assert all(0 < top[0]["probability"] <= 1 for top in result.predictions)
    # The runner's output is torchvision's module itself, fed the weights the runner recorded (seeded by torch).
    module = torchvision.models.get_model(arch, weights=None).eval()
    torch.manual_seed(int(np.random.default_rng(cfg.seed).integers(2**31)))
    module.load_state_dict(torchvision.models.get_model(arch, weights=None).state_dict())
    with torch.no_grad():
        expected = module(torch.from_numpy(_outputs(tmp_path, "inputs/x"))).numpy()
    np.testing.assert_allclose(_outputs(tmp_path), expected, rtol=0, atol=1e-5 * np.abs(expected).max())


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["eager", "vectorized_map", "function"])
def test_torchvision_gradients_in_every_torch_mode(mode, tmp_path):
    cfg = compose_config(
        "backend=torch", "model=torchvision", "model.arch=mobilenet_v3_small", "task=gradients", f"mode={mode}", *SMALL
    )
    result = run_and_record(job_spec(cfg), tmp_path)
    assert result.status == "FINISHED", result.error
    with h5py.File(tmp_path / "tensors.h5", "r") as f:
        grad = f["gradients/classifier.3.weight"][()]
    assert grad.shape == ((2, 1000, 1024) if mode == "vectorized_map" else (1000, 1024)) and np.isfinite(grad).all()


def test_torchvision_errors_are_one_line():
    from runner.models.torchvision_model import TorchvisionModel

    with pytest.raises(ConfigError, match=r"^model.arch=resnet19 is not a torchvision classifier \(closest: resnet18"):
        TorchvisionModel("resnet19", 64)
    with pytest.raises(ConfigError, match="smallest size it takes is 21 .data.image_size=21.$"):
        TorchvisionModel("squeezenet1_0", 8).make_inputs(np.random.default_rng(0), 1)
    with pytest.raises(ConfigError, match="vit_b_16 cannot take 64x64 images .*smallest size it takes is 224"):
        TorchvisionModel("vit_b_16", 64).make_inputs(np.random.default_rng(0), 1)


def test_torchvision_pretrained_reads_the_hub_cache_only(tmp_path, monkeypatch):
    import torch
    import torchvision

    monkeypatch.setenv("TORCH_HOME", str(tmp_path))
    overrides = ("backend=torch", "model=torchvision", "model.arch=mobilenet_v3_small", "model.pretrained=true")
    result = run_and_record(job_spec(compose_config(*overrides, "task=inference", *SMALL)), tmp_path / "missing")
    assert result.status == "FAILED"
    assert result.error.startswith("model.pretrained=true: mobilenet_v3_small-047dcff4.pth is not in the torch hub")
    module = torchvision.models.get_model("mobilenet_v3_small", weights=None).eval()  # stands in for the published file
    (tmp_path / "hub" / "checkpoints").mkdir(parents=True)
    torch.save(module.state_dict(), tmp_path / "hub" / "checkpoints" / "mobilenet_v3_small-047dcff4.pth")
    result = run_and_record(job_spec(compose_config(*overrides, "task=inference", *SMALL)), tmp_path / "cached")
    assert result.status == "FINISHED", result.error
    with torch.no_grad():
        expected = module(torch.from_numpy(_outputs(tmp_path / "cached", "inputs/x"))).numpy()
    np.testing.assert_allclose(_outputs(tmp_path / "cached"), expected, rtol=0, atol=1e-5 * np.abs(expected).max())


def test_torchvision_on_another_backend_points_to_the_cross_framework_routes(tmp_path):
    out = run_cli("backend=tensorflow", "model=torchvision", "tracking=none", f"hydra.run.dir={tmp_path}")
    assert out.returncode == 2
    error = out.stderr.strip().removeprefix("error: ")
    assert error.startswith(
        "model=torchvision needs torch_module ops: it runs on backend=torch, not backend=tensorflow"
    )
    assert "model=keras" in error and "model=resnet18" in error and "\n" not in error
    with pytest.raises(
        ConfigError, match="model=keras runs only mode=eager or mode=function or mode=map_fn on backend"
    ):
        check_combination(compose_config("backend=torch", "model=keras", "mode=vectorized_map"))
    with pytest.raises(
        ConfigError, match="model=keras needs keras ops: it runs on backend=jax or backend=tensorflow or backend=torch"
    ):
        check_combination(compose_config("backend=numpy", "model=keras", "mode=eager"))


# -- Keras on TensorFlow and torch -----------------------------------------------------------------


def _keras_run(tmp: Path, backend: str, *extra: str) -> Path:
    run_dir = tmp / backend
    out = run_cli(
        f"backend={backend}",
        "model=keras",
        "model.arch=MobileNetV2",
        "data.image_size=96",
        "batch_size=2",
        "tracking=none",
        f"hydra.run.dir={run_dir}",
        *FAST_TIMING,
        *extra,
        timeout=900,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return run_dir


KERAS_README_SWEEP = (
    "-m backend=tensorflow,torch,jax model=keras model.arch=MobileNetV2 task=inference data.image_size=96 batch_size=2"
)


@pytest.mark.heavy  # three processes importing Keras on three frameworks: CI runs it after the default set
def test_keras_mobilenetv2_same_seed_same_outputs_on_tensorflow_torch_and_jax(tmp_path):
    """The README's Keras sweep, as printed (test_readme_commands leaves it to this test): one model, three
    backends, the same outputs."""
    out = run_cli(
        *KERAS_README_SWEEP.split(), "tracking=none", f"hydra.sweep.dir={tmp_path}", *FAST_TIMING, timeout=900
    )
    assert out.returncode == 0, out.stderr[-3000:]
    runs = {json.loads((d / "result.json").read_text())["config"]["backend"]["name"]: d for d in tmp_path.glob("[0-9]")}
    assert set(runs) == {"tensorflow", "torch", "jax"}
    on_tf = _outputs(runs["tensorflow"])
    assert on_tf.shape == (2, 1000)
    for backend in ("torch", "jax"):
        assert np.abs(on_tf - _outputs(runs[backend])).max() <= 1e-4 * np.abs(on_tf).max(), backend
    for run in runs.values():
        saved = json.loads((run / "result.json").read_text())
        assert saved["status"] == "FINISHED" and len(saved["predictions"]) == 2
        # against the same model in float64 on Keras's TensorFlow backend, within float32's tolerance
        assert saved["metrics"]["within_reference_tolerance"] == 1.0, saved["metrics"]["max_rel_err_vs_reference"]


KERAS_SAVE = """
import os, sys
os.environ["KERAS_BACKEND"] = "torch"
import keras
keras.utils.set_random_seed(7)
model = keras.applications.MobileNetV2(weights=None, input_shape=(96, 96, 3), classifier_activation=None)
model.save_weights(sys.argv[1])
"""


@pytest.mark.slow
def test_keras_weights_saved_under_torch_load_under_tensorflow_and_jax_with_the_same_gradients(tmp_path):
    weights = tmp_path / "mobilenet.weights.h5"
    subprocess.run([sys.executable, "-c", KERAS_SAVE, str(weights)], check=True, timeout=600)
    backends = ("torch", "tensorflow", "jax")
    runs = {b: _keras_run(tmp_path, b, f"model.weights={weights}", "task=gradients") for b in backends}
    np.testing.assert_array_equal(_outputs(runs["torch"], "inputs/x"), _outputs(runs["tensorflow"], "inputs/x"))
    on_tf = _outputs(runs["tensorflow"])
    kernels = {}
    for backend, run in runs.items():
        assert np.abs(on_tf - _outputs(run)).max() <= 1e-4 * np.abs(on_tf).max(), backend
        with h5py.File(run / "tensors.h5", "r") as f:
            kernels[backend] = f["gradients/Conv1/kernel"][()]
    assert kernels["torch"].shape == (3, 3, 3, 32)  # Keras's layout on every backend
    for backend in ("torch", "jax"):
        assert np.abs(kernels[backend] - kernels["tensorflow"]).max() <= 1e-3 * np.abs(kernels["tensorflow"]).max()


@pytest.mark.slow
def test_keras_per_example_gradients_agree_between_tensorflow_and_torch(tmp_path):
    """What each backend can: tf.vectorized_map on TensorFlow, the loop (map_fn) on torch."""
    on_tf = _keras_run(tmp_path, "tensorflow", "task=gradients", "mode=vectorized_map")
    on_torch = _keras_run(tmp_path, "torch", "task=gradients", "mode=map_fn")
    with h5py.File(on_tf / "tensors.h5", "r") as a, h5py.File(on_torch / "tensors.h5", "r") as b:
        tf_kernel, torch_kernel = a["gradients/Conv1/kernel"][()], b["gradients/Conv1/kernel"][()]
    assert tf_kernel.shape == (2, 3, 3, 3, 32)
    assert np.abs(tf_kernel - torch_kernel).max() <= 1e-3 * np.abs(tf_kernel).max()


KERAS_ERRORS = """
from runner.config import ConfigError
from runner.models.keras_model import KerasModel
for arch, size in (("MobileNetV5", 96), ("MobileNetV2", 16)):
    try:
        KerasModel(arch, "runner.backends.torch_backend", size)
    except ConfigError as error:
        print(error)
"""


@pytest.mark.heavy  # a process importing Keras on torch (~13 s); the other Keras tests are the heavy set's too
def test_keras_errors_are_one_line():
    """In a fresh process: each process can import Keras on one backend only (here torch)."""
    import subprocess
    import sys

    from helpers import _env

    done = subprocess.run([sys.executable, "-c", KERAS_ERRORS], env=_env(), capture_output=True, text=True, timeout=300)
    lines = done.stdout.splitlines()
    assert len(lines) == 2, done.stdout + done.stderr[-2000:]
    assert re.match(r"^model.arch=MobileNetV5 is not a keras.applications model \(closest: ", lines[0])
    assert re.search("MobileNetV2 cannot take 16x16 images .*smallest size it takes is 32", lines[1])


# -- a user's own workload, from a copy outside the repository -------------------------------------


@pytest.fixture
def own_model_copy(tmp_path_factory) -> Path:
    copy = tmp_path_factory.mktemp("user") / "own_model"
    shutil.copytree(EXAMPLE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    assert PROJECT_ROOT not in copy.parents
    return copy


def test_own_model_backward_matches_finite_differences(own_model_copy, monkeypatch):
    monkeypatch.syspath_prepend(str(own_model_copy))
    from own_model import SmallConvNet

    from runner.backends import numpy_backend

    model = SmallConvNet(image_size=6, filters=3, classes=4)
    rng = np.random.default_rng(1)
    params, inputs = model.init_params(rng), model.make_inputs(rng, 2)
    grads = model.gradients(params, inputs["x"], inputs["labels"])
    for name, value in params.items():
        index = tuple(rng.integers(0, n) for n in value.shape)
        step = np.zeros_like(value)
        step[index] = 1e-6
        loss = [
            model.loss(numpy_backend, {**params, name: value + s}, inputs["x"], inputs["labels"]) for s in (step, -step)
        ]
        assert abs((loss[0] - loss[1]) / 2e-6 - grads[name][index]) < 1e-6 * max(1.0, abs(grads[name][index]))


@pytest.mark.parametrize(
    "backend,mode",
    [
        ("numpy", "map_fn"),
        ("torch", "eager"),
        ("torch", "vectorized_map"),
        ("tensorflow", "eager"),
        ("tnp", "function"),
    ],
)
def test_own_model_from_outside_the_repository_matches_its_float64_reference(
    backend, mode, own_model_copy, tmp_path, monkeypatch
):
    monkeypatch.syspath_prepend(str(own_model_copy))
    cfg = compose_config(
        f"hydra.searchpath=[file://{own_model_copy / 'conf'}]",
        f"backend={backend}",
        f"mode={mode}",
        "model=small_convnet",
        "dtype=float64",
        "task=gradients",
        "batch_size=3",
        "tracking=none",
        "isolation=inline",
    )
    result = run_and_record(job_spec(cfg), tmp_path)
    assert result.status == "FINISHED", result.error
    assert result.metrics["max_rel_err_vs_reference"] < 1e-9
    assert result.tensors["gradients/conv.weight"].shape == (
        (3, 8, 27) if mode in ("vectorized_map", "map_fn") else (8, 27)
    )


def test_own_model_runs_from_the_command_line_with_the_users_pythonpath(own_model_copy, tmp_path, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", f"{own_model_copy}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    out = run_cli(
        f"hydra.searchpath=[file://{own_model_copy / 'conf'}]",
        "model=small_convnet",
        "backend=numpy",
        "dtype=float64",
        "tracking=none",
        f"hydra.run.dir={tmp_path}",
        *FAST_TIMING,
        cwd=own_model_copy.parent,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    saved = json.loads((tmp_path / "result.json").read_text())
    assert saved["status"] == "FINISHED" and saved["metrics"]["max_rel_err_vs_reference"] < 1e-12


def test_a_weights_file_for_a_workload_without_a_spec_of_its_weights_is_refused_in_one_line(tmp_path):
    """A workload that names no loadable weights (`spec` None) given model.weights: a ConfigError, not a TypeError
    from inside the checkpoint match (mypy found it)."""
    from omegaconf import OmegaConf

    from runner.models import Workload, initial_weights

    class Plain(Workload):
        name = "plain"

        def init_params(self, rng):
            return {"w": np.zeros(2)}

    with h5py.File(tmp_path / "w.h5", "w") as f:  # a readable weights file, with the one parameter it has
        f["w"] = np.ones(2)
    model_cfg = OmegaConf.create({"weights": str(tmp_path / "w.h5")})
    with pytest.raises(ConfigError, match="model=plain takes no weights file"):
        initial_weights(model_cfg, Plain(), np.random.default_rng(0))

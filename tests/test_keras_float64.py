"""model=keras in float64: where Keras leaves float64 (torch and JAX: keras.backend.result_type turns float64 into
float32), what the record says about it, and the reference every Keras run is checked against (the same model in
float64 on Keras's TensorFlow backend).

Measured (docs/models.md): MobileNetV2's float64 logits on torch and JAX are float32's error (1e-7) from
TensorFlow's; with result_type keeping float64 they agree to 1e-15, layer by layer."""

from __future__ import annotations

import json
import subprocess
import sys

import h5py
import numpy as np
import pytest
from helpers import FAST_TIMING, _env, run_cli

BACKENDS = ("tensorflow", "torch", "jax")
FLOAT64_BOUND = 1e-12  # float64 logits of one model on two backends, where each computes in float64 throughout
FLOAT32_ERROR = (1e-9, 1e-5)  # float32's rounding in a float64 computation: past float64's tolerance, within float32's

KERAS_FLOAT64 = """
import json, sys
import numpy as np
from runner.backends import load_backend
from runner.models.keras_model import KerasModel

backend, keep = sys.argv[1], sys.argv[2] == "keep"
module = f"runner.backends.{backend}_backend"
ops = load_backend(module)
ops.prepare("cpu", "float64")
model = KerasModel("MobileNetV2", module, 32, "float64")
if keep:  # Keras's own table, as a fixed Keras would have it: result_type keeps float64 on every backend
    from keras.src.backend.common import dtypes
    dtypes.BIT64_TO_BIT32_DTYPE["float64"] = "float64"
rng = np.random.default_rng(0)
params, x = model.init_params(rng), model.make_inputs(rng, 2)["x"]
placed = {k: ops.asarray(v, "cpu", "float64") for k, v in params.items()}
y = ops.to_numpy(model.forward(ops, placed, ops.asarray(x, "cpu", "float64")))
np.save(sys.argv[3], y)
print(json.dumps({"dtype": str(y.dtype), "inside": model.float32_inside(), "warnings": model.run_warnings()}))
"""


def _keras_float64(backend: str, keep: bool, out) -> tuple[np.ndarray, dict]:
    done = subprocess.run(
        [sys.executable, "-c", KERAS_FLOAT64, backend, "keep" if keep else "as-is", str(out)],
        env=_env(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return np.load(out), json.loads(done.stdout.strip().splitlines()[-1])


def _rel(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(a - b).max() / np.abs(b).max())


@pytest.mark.heavy  # Keras on torch in a fresh process (~25 s): Keras on other backends is the heavy set's
def test_keras_on_torch_says_where_a_float64_model_computes_in_float32(tmp_path):
    """The record's words, from Keras itself: on torch result_type demotes float64, so the float64 MobileNetV2 names
    the layers that compute in float32 (measured on Keras 3.15.1) and warns; in float32 nothing is said."""
    y, said = _keras_float64("torch", False, tmp_path / "y.npy")
    assert said["dtype"] == "float64"  # cast back: the outputs look float64 whatever computed them
    if not said["inside"]:
        pytest.skip("this Keras keeps float64 on torch (keras-team/keras#23704 fixed): nothing to say")
    assert said["inside"].startswith("BatchNormalization, ops.mean (GlobalAveragePooling2D), ops.matmul (Dense)")
    assert "keras.backend.result_type('float64', 'float32') is float32 on Keras's torch backend" in said["inside"]
    (warning,) = said["warnings"]
    assert warning.startswith("dtype=float64 is float32 in part: BatchNormalization") and "\n" not in warning


@pytest.mark.heavy  # three processes importing Keras on three frameworks, twice
def test_keras_float64_forward_agrees_across_backends_where_float64_is_kept(tmp_path):
    """The runner's float64 path (seeded float64 weights, float64 inputs, stateless_call) is float64 on every
    backend but for Keras's result_type: with its table keeping float64, TensorFlow, torch and JAX give the same
    logits to 1e-12; as shipped, torch and JAX are float32's error away, and say so."""
    kept = {b: _keras_float64(b, True, tmp_path / f"{b}-kept.npy")[0] for b in BACKENDS}
    shipped = {b: _keras_float64(b, False, tmp_path / f"{b}.npy") for b in BACKENDS}
    on_tf = shipped["tensorflow"][0]
    np.testing.assert_array_equal(kept["tensorflow"], on_tf)  # TensorFlow keeps float64 either way
    for backend in ("torch", "jax"):
        assert _rel(kept[backend], on_tf) <= FLOAT64_BOUND, backend
        y, said = shipped[backend]
        if said["inside"]:
            assert FLOAT32_ERROR[0] < _rel(y, on_tf) < FLOAT32_ERROR[1], backend
        else:
            assert _rel(y, on_tf) <= FLOAT64_BOUND, backend


@pytest.mark.heavy  # three runs of model=keras, each with its float64 reference on TensorFlow in a subprocess
def test_keras_runs_record_their_error_against_float64_on_tensorflow(tmp_path):
    """max_rel_err_vs_reference is never null for model=keras: the same model in float64 on TensorFlow. A float64
    run on TensorFlow is that computation (exact); on torch and JAX, where Keras computes parts in float32, the
    error is float32's and the record says why, in the environment and a warning."""
    runs = {}
    for backend in BACKENDS:
        run_dir = tmp_path / backend
        out = run_cli(
            f"backend={backend}",
            "model=keras",
            "model.arch=MobileNetV2",
            "task=inference",
            "dtype=float64",
            "data.image_size=32",
            "batch_size=2",
            "tracking=none",
            f"hydra.run.dir={run_dir}",
            *FAST_TIMING,
            timeout=900,
        )
        assert out.returncode == 0, out.stderr[-3000:]
        runs[backend] = json.loads((run_dir / "result.json").read_text())
        with h5py.File(run_dir / "tensors.h5", "r") as f:
            runs[backend]["y"] = f["outputs/y"][()]
    assert runs["tensorflow"]["metrics"]["max_rel_err_vs_reference"] <= FLOAT64_BOUND
    assert runs["tensorflow"]["environment"]["keras_float64"] == "float64 throughout"
    for backend in ("torch", "jax"):
        metrics, environment = runs[backend]["metrics"], runs[backend]["environment"]
        error = metrics["max_rel_err_vs_reference"]
        assert abs(error - _rel(runs[backend]["y"], runs["tensorflow"]["y"])) <= 1e-3 * error + FLOAT64_BOUND
        assert "on Keras's tensorflow backend" in environment["keras_reference"]
        if environment["keras_float64"] == "float64 throughout":
            assert error <= FLOAT64_BOUND, backend
            continue
        assert FLOAT32_ERROR[0] < error < FLOAT32_ERROR[1], (backend, error)
        assert metrics["within_reference_tolerance"] == 0.0  # float64's tolerance, which Keras does not meet here
        assert environment["keras_float64"].startswith("float32 inside: BatchNormalization")
        assert any(w.startswith("dtype=float64 is float32 in part") for w in runs[backend]["warnings"])

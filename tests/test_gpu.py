"""CUDA paths, run only where a GPU is present (`pytest -m gpu`); skipped elsewhere."""

from __future__ import annotations

import json

import h5py
import numpy as np
import pytest

pytestmark = pytest.mark.gpu


@pytest.fixture(autouse=True)
def _needs_cuda():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")


def _run(cli, tmp_path, *overrides):
    result = cli("tracking=none", f"hydra.run.dir={tmp_path}", "timing.max_time_s=1", *overrides)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads((tmp_path / "result.json").read_text()), h5py.File(tmp_path / "tensors.h5", "r")


def test_cuda_gradients_float64_match_numpy_reference(cli, tmp_path):
    saved, f = _run(cli, tmp_path, "backend=torch", "device=cuda", "task=gradients", "dtype=float64")
    with f:
        assert f.attrs["device"] == "cuda"
    assert saved["metrics"]["max_abs_err_vs_reference"] < 1e-9
    assert saved["metrics"]["peak_device_mb"] > 0
    assert "NVIDIA" in saved["environment"]["device_name"]


def test_auto_device_picks_cuda(cli, tmp_path):
    saved, f = _run(cli, tmp_path, "backend=torch", "device=auto", "model=matmul", "model.n=512", "task=inference")
    f.close()
    assert saved["environment"]["device"] == "cuda"
    assert saved["metrics"]["max_rel_err_vs_reference"] < 1e-5  # TF32 is off


@pytest.mark.parametrize("mode", ["vectorized_map", "map_fn"])
def test_cuda_per_example_gradients(cli, tmp_path, mode):
    saved, f = _run(cli, tmp_path, "backend=torch", "device=cuda", f"mode={mode}", "dtype=float64", "batch_size=16")
    with f:
        assert f["gradients/dense.weight"].shape == (16, 64, 32)
    assert saved["metrics"]["max_abs_err_vs_reference"] < 1e-9


def test_cuda_torch_compile(cli, tmp_path):
    saved, f = _run(cli, tmp_path, "backend=torch", "device=cuda", "mode=function", "task=gradients")
    f.close()
    assert saved["metrics"]["first_call_s"] > saved["metrics"]["time_median_s"]  # compilation is in the first call
    assert saved["metrics"]["max_rel_err_vs_reference"] < 1e-4


def test_cuda_timing_waits_for_the_gpu(cli, tmp_path):
    """A 4096^3 float32 matmul cannot run faster than the H100/H200's ~60 TFLOP/s without TF32:
    a time that ignores queued kernels would report an impossible rate."""
    saved, f = _run(cli, tmp_path, "backend=torch", "device=cuda", "model=matmul", "model.n=4096", "task=inference")
    f.close()
    assert 1_000 < saved["metrics"]["gflops_per_s"] < 80_000
    assert np.isfinite(saved["metrics"]["time_iqr_s"])

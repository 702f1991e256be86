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


# -- everyday API, parity, every mode, energy, OOM, load_s on cuda ----------------------------------


@pytest.mark.parametrize("mode", ["eager", "function", "xla", "vectorized_map", "map_fn"])
def test_cuda_every_mode_gradients(cli, tmp_path, mode):
    saved, f = _run(cli, tmp_path, "backend=torch", "device=cuda", f"mode={mode}", "batch_size=16")
    f.close()
    assert saved["metrics"]["max_rel_err_vs_reference"] < 1e-4
    assert saved["metrics"]["load_s"] > 0


def test_cuda_graphs_output_read_before_it_is_overwritten(cli, tmp_path):
    """max-autotune replays CUDA graphs into the same buffers: the first call's output is copied off the
    device before the next call, so the run finishes (it failed with 'accessing tensor output of CUDAGraphs
    that has been overwritten by a subsequent run')."""
    overrides = ("model=resnet18", "mode=xla", "dtype=bfloat16", "task=inference", "data.image_size=64")
    saved, f = _run(cli, tmp_path, "backend=torch", "device=cuda", *overrides, "batch_size=4")
    with f:
        assert np.isfinite(f["outputs/y"][()]).all()
    assert len(saved["predictions"]) == 4


def test_cuda_energy_or_its_absence_recorded(cli, tmp_path):
    saved, f = _run(
        cli,
        tmp_path,
        "backend=torch",
        "device=cuda",
        "model=matmul",
        "model.n=4096",
        "task=inference",
        "timing.max_time_s=2",
    )
    f.close()
    if "energy_per_call_j" in saved["metrics"]:
        assert saved["metrics"]["energy_per_call_j"] > 0 and saved["metrics"]["examples_per_j"] > 0
        assert "NVML" in saved["environment"]["energy_source"]
    else:
        assert saved["environment"]["energy_unavailable_reason"]


def test_cuda_context_start_is_in_load_s_not_the_first_call(cli, tmp_path):
    saved, f = _run(cli, tmp_path, "backend=torch", "device=cuda", "task=inference")
    f.close()
    assert saved["metrics"]["load_s"] > 0
    assert saved["metrics"]["first_call_s"] < saved["metrics"]["load_s"] + 1.0


def test_cuda_out_of_memory_fails_the_job_and_the_sweep_goes_on(cli, tmp_path):
    """resnet50 gradients at batch 4096 keep ~100 GB of activations: past the preflight (which counts
    weights and inputs), torch's own out-of-memory error ends the job."""
    result = cli(
        "-m",
        "tracking=none",
        f"hydra.sweep.dir={tmp_path}",
        "timing.max_time_s=1",
        "backend=torch",
        "device=cuda",
        "model=resnet50",
        "task=gradients",
        "batch_size=4096,2",
        timeout=900,
    )
    assert result.returncode == 1
    first = json.loads((tmp_path / "0" / "result.json").read_text())
    second = json.loads((tmp_path / "1" / "result.json").read_text())
    assert first["status"] == "FAILED" and "out of memory" in first["error"].lower()
    assert second["status"] == "FINISHED"


def test_cuda_parity_benchmark_writes_rows_with_the_gpu_name(tmp_path):
    import subprocess
    import sys

    from runner.config import PROJECT_ROOT

    out = tmp_path / "BENCHMARKS.md"
    command = [
        sys.executable,
        str(PROJECT_ROOT / "benchmarks" / "parity.py"),
        "--device",
        "cuda",
        "--backends",
        "torch",
        "--budget",
        "0.3",
        "--out",
        str(out),
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=1800)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [line for line in out.read_text().splitlines() if line.startswith("| torch | cuda (")]
    assert {row.split(" | ")[2] for row in rows} == {
        "mlp_gradients_eager",
        "mlp_gradients_compiled",
        "mlp_jacobian",
        "mlp_inference",
        "resnet18_inference_b8",
        "matmul",
    }
    assert all("NVIDIA" in row or "H100" in row or "H200" in row for row in rows)


def test_tensorflow_on_cuda_where_it_sees_the_gpu(cli, tmp_path):
    tf = pytest.importorskip("tensorflow")
    if not tf.config.list_physical_devices("GPU"):
        pytest.skip("TensorFlow sees no GPU here")
    saved, f = _run(cli, tmp_path, "backend=tensorflow", "device=cuda", "mode=function", "task=gradients")
    f.close()
    assert saved["metrics"]["max_rel_err_vs_reference"] < 1e-4 and saved["metrics"]["load_s"] > 0

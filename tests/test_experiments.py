"""Every experiment file runs with `python run.py +experiment=NAME` (on a small grid, as CI can afford)."""

from __future__ import annotations

import json

import pytest

from runner.config import PROJECT_ROOT, nvidia_driver_present

SMALL_GRIDS = {
    "cpu_vs_gpu_matmul": ["model.n=64"],
    "tf_function_speedup": ["backend=tensorflow,tnp", "mode=eager,function", "batch_size=32"],
    "per_example_gradients": ["backend=tensorflow,torch,jax", "batch_size=8"],
    "sigmoid_scaling": ["model.size=1,1024"],
    "resnet_inference": ["model=resnet18", "mode=eager", "data.image_size=64"],
    "horse2zebra": ["data.image_size=64"],
    "tensor_conversion": ["model.size=1024"],
    "view_vs_reshape": ["model.n=16"],
}
FAST = ["tracking=none", "isolation=inline", "timing.warmup_s=0.01", "timing.min_repeats=3", "timing.max_time_s=0.2"]


def test_every_experiment_file_has_a_smoke_test():
    files = {path.stem for path in (PROJECT_ROOT / "experiments").glob("*.yaml")}
    assert files == set(SMALL_GRIDS)


@pytest.mark.parametrize("name", sorted(SMALL_GRIDS))
def test_experiment_runs_as_one_command(cli, tmp_path, name):
    result = cli(f"+experiment={name}", *FAST, f"hydra.sweep.dir={tmp_path}", *SMALL_GRIDS[name], timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    results = [json.loads(path.read_text()) for path in sorted(tmp_path.glob("*/result.json"))]
    assert results and all(r["status"] == "FINISHED" for r in results)
    assert "time / fastest" in result.stdout  # the comparison the seed made, printed at the end
    devices = {r["environment"]["device"] for r in results}
    assert devices == ({"cpu", "cuda"} if nvidia_driver_present() and name == "cpu_vs_gpu_matmul" else {"cpu"})
    if name == "tensor_conversion":
        shared = {
            r["config"]["model"]["method"]: r["metrics"]["shares_memory"]
            for r in results
            if r["config"]["backend"]["name"] == "torch"
        }
        assert shared["from_numpy"] == 1.0 and shared["tensor"] == 0.0  # torch.tensor always copies
        on_jax = {
            r["config"]["model"]["method"]: r["metrics"]["shares_memory"]
            for r in results
            if r["config"]["backend"]["name"] == "jax"
        }
        assert on_jax["numpy"] == 1.0 and on_jax["asarray"] == on_jax["array"] == 0.0  # jnp.asarray copies
    if name == "view_vs_reshape":
        copied = {
            (r["config"]["backend"]["name"], r["config"]["model"]["method"]): r["metrics"]["copied"] for r in results
        }
        assert copied[("torch", "view")] == 0.0 and copied[("torch", "transpose_contiguous")] == 1.0
        assert copied[("numpy", "reshape")] == 0.0 and copied[("numpy", "transpose_reshape")] == 1.0
        assert copied[("jax", "transpose")] == 1.0  # jax arrays are immutable buffers: XLA writes a new one
    if name == "horse2zebra":
        assert all((tmp_path / str(job) / "images" / "000.png").exists() for job in range(len(results)))

"""backend=jax: every mode and task its capabilities allow, checked against the float64 reference; JAX's
own settings (x64, the thread pool's CPU affinity, dtypes) as a user meets them."""

from __future__ import annotations

import json
import os

import h5py
import numpy as np
import pytest
from helpers import run_cli

import runner.backends
import runner.config
from runner.measure.job import run_and_record
from runner.record.naming import job_spec

MODES_AND_TASKS = [
    # eager JAX compiles each op at its first call (3-4 s a task on 2 cores): its gradients in the default set, its
    # inference and jacobian with the heavy set, which CI runs after it
    pytest.param(mode, task, marks=[pytest.mark.heavy] * (mode == "eager" and task != "gradients"))
    for mode in ("eager", "function", "xla")
    for task in ("inference", "gradients", "jacobian")
] + [("vectorized_map", "gradients"), ("map_fn", "gradients")]


@pytest.mark.parametrize(("mode", "task"), MODES_AND_TASKS)
def test_every_mode_and_task_in_float64_matches_the_reference(make_config, tmp_path, mode, task):
    cfg = make_config("backend=jax", f"mode={mode}", f"task={task}", "dtype=float64", "tracking=none", "batch_size=8")
    outcome = run_and_record(job_spec(cfg), tmp_path)
    assert outcome.status == "FINISHED", outcome.error
    assert outcome.metrics["max_rel_err_vs_reference"] < 1e-9
    with h5py.File(tmp_path / "tensors.h5", "r") as f:
        assert all(f[path].dtype == np.float64 for path in ("outputs/y", "inputs/x"))  # x64 really on


@pytest.mark.parametrize(
    ("dtype", "stored", "tolerance"), [("float32", np.float32, 1e-5), ("bfloat16", np.float32, 3e-2)]
)
def test_lower_precisions_compute_in_their_dtype(make_config, tmp_path, dtype, stored, tolerance):
    cfg = make_config("backend=jax", "mode=function", "task=gradients", f"dtype={dtype}", "tracking=none")
    outcome = run_and_record(job_spec(cfg), tmp_path)
    assert outcome.status == "FINISHED", outcome.error
    assert 0 < outcome.metrics["max_rel_err_vs_reference"] < tolerance  # rounded as the dtype rounds, no worse
    with h5py.File(tmp_path / "tensors.h5", "r") as f:
        assert f["gradients/dense.weight"].dtype == stored  # bfloat16 comes back as float32


def test_op_workloads_compile_with_the_ops_module_bound(make_config, tmp_path):
    """The ops module bound to a workload's forward is a static argument of jax.jit, not an array."""
    for mode in ("function", "xla"):
        cfg = make_config("backend=jax", "model=sigmoid", "model.size=100", "task=inference", f"mode={mode}")
        outcome = run_and_record(job_spec(cfg), tmp_path / mode)
        assert outcome.status == "FINISHED", outcome.error
        assert outcome.metrics["max_rel_err_vs_reference"] < 1e-6


def test_threads_set_the_cpu_affinity_of_the_worker(tmp_path):
    """XLA's CPU pool follows the affinity: threads=1 leaves the job one CPU, recorded (a worker process,
    so the pinning stays there)."""
    out = run_cli("backend=jax", "threads=1", "tracking=none", f"hydra.run.dir={tmp_path}", "timing.max_time_s=0.2")
    assert out.returncode == 0, out.stderr[-2000:]
    record = json.loads((tmp_path / "result.json").read_text())
    assert record["environment"]["cpu_affinity"] == 1
    assert record["environment"]["framework"] == "jax"


@pytest.mark.parametrize("backend", ["jax", "tensorflow"])
def test_a_cuda_job_takes_gpu_memory_as_needed_and_keeps_what_the_user_set(make_config, tmp_path, monkeypatch, backend):
    """In interleaved rounds every job's worker is alive at once: with JAX preallocating 75% of the GPU (TensorFlow
    all of it) in each, the second runs out of memory. The worker's environment when its framework is imported
    (stopped there: no GPU here) says to allocate as needed, unless the user said otherwise."""
    names = ("XLA_PYTHON_CLIENT_PREALLOCATE", "TF_FORCE_GPU_ALLOW_GROWTH")
    seen = []

    def load_backend(module):
        seen.append({name: os.environ.get(name) for name in names})
        raise RuntimeError("stopped where the framework would be imported")

    def job(device: str) -> None:
        cfg = make_config(f"backend={backend}", f"device={device}", "tracking=none")
        assert "stopped where" in run_and_record(job_spec(cfg), tmp_path / device).error
        monkeypatch.delenv("TF_FORCE_GPU_ALLOW_GROWTH", raising=False)  # each job starts without it

    monkeypatch.setattr(runner.backends, "load_backend", load_backend)
    monkeypatch.setattr(runner.config, "nvidia_driver_present", lambda: True)  # device=cuda passes its check
    monkeypatch.setattr(runner.backends, "nvidia_driver_present", lambda: True)  # device=auto counts as cuda
    monkeypatch.delenv("TF_FORCE_GPU_ALLOW_GROWTH", raising=False)
    monkeypatch.setenv("XLA_PYTHON_CLIENT_PREALLOCATE", "true")  # the user's
    job("cpu")
    job("cuda")
    assert seen == [
        {"XLA_PYTHON_CLIENT_PREALLOCATE": "true", "TF_FORCE_GPU_ALLOW_GROWTH": None},
        {"XLA_PYTHON_CLIENT_PREALLOCATE": "true", "TF_FORCE_GPU_ALLOW_GROWTH": "true"},
    ]
    for device in ("cuda", "auto"):
        monkeypatch.delenv("XLA_PYTHON_CLIENT_PREALLOCATE")
        job(device)
        assert seen[-1] == {"XLA_PYTHON_CLIENT_PREALLOCATE": "false", "TF_FORCE_GPU_ALLOW_GROWTH": "true"}


def test_the_record_says_how_the_frameworks_take_gpu_memory(monkeypatch):
    from runner.record import environment

    monkeypatch.setenv("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    monkeypatch.delenv("TF_FORCE_GPU_ALLOW_GROWTH", raising=False)
    recorded = environment.collect({})
    assert recorded["XLA_PYTHON_CLIENT_PREALLOCATE"] == "false" and "TF_FORCE_GPU_ALLOW_GROWTH" not in recorded

"""Sizes beyond the machine: refused before any allocation with the estimate; long jobs announced."""

from __future__ import annotations

import pytest

from runner.config import ConfigError, TimingConfig
from runner.measure import limits
from runner.models.mlp import MLP
from runner.models.op_workloads import Matmul
from runner.tasks.builtin import Gradients, Inference, Jacobian
from runner.tasks.train_step import TrainStep


def test_huge_matmul_refused_before_allocating_with_the_estimate(cli, tmp_path):
    """Refused from the estimate, before any array is made (a 2.88 TB allocation would fail otherwise, not with
    this line), and before the framework loads (issue 79: it came after, with a FAILED run): exit 2, one line, no
    framework imported, nothing written. No bound on the wall time, which a busy 2-core machine can miss."""
    run_dir = tmp_path / "run"
    result = cli("backend=torch", "model=matmul", "task=inference", "model.n=300000", "tracking=none",
                 f"hydra.run.dir={run_dir}", env={"PYTHONIMPORTTIME": "1"})  # fmt: skip
    assert result.returncode == 2
    lines = result.stderr.splitlines()
    errors = [line for line in lines if line.startswith("error:")]
    assert len(errors) == 1 and "needs about 2.88 TB of host memory" in errors[0] and "is free" in errors[0]
    assert errors[0].startswith("error: model=matmul model.n=300000 dtype=float32 needs about")
    imported = {line.rsplit("|", 1)[-1].strip() for line in lines if line.startswith("import time")}
    assert not imported & {"torch", "tensorflow", "jax"}
    assert not run_dir.exists()


def test_memory_estimate_counts_draws_copies_and_reference():
    n = 1000
    host, device, reference = limits.memory_needed(
        Inference("inference").array_elements(Matmul(n), 1, False), 4, "cpu", True
    )
    assert reference == 8 * 2 * n * n and device == 0
    assert host == 8 * n * n + 4 * 2 * n * n + reference  # float64 draw, float32 input and result, reference
    host, device, reference = limits.memory_needed(
        Inference("inference").array_elements(Matmul(n), 1, False), 2, "cuda", False
    )
    assert (host, device, reference) == (8 * n * n + 2 * n * n, 2 * 2 * n * n, 0)


def test_device_memory_refused(monkeypatch):
    monkeypatch.setattr(limits, "free_device_bytes", lambda: 10**9)
    with pytest.raises(ConfigError, match=r"needs about 8 GB of GPU memory .* but 1 GB is free on the GPU"):
        limits.check_memory("model=matmul", host=10, device_bytes=8 * 10**9, reference_bytes=0, device="cuda")


def test_reference_hint_only_where_it_would_help(monkeypatch):
    import psutil

    free = psutil.virtual_memory().available
    with pytest.raises(ConfigError, match="check_reference=false"):
        limits.check_memory("m", host=free + 10**9, device_bytes=0, reference_bytes=2 * 10**9, device="cpu")
    with pytest.raises(ConfigError) as refused:
        limits.check_memory("m", host=3 * free, device_bytes=0, reference_bytes=10**9, device="cpu")
    assert "check_reference" not in str(refused.value)


def test_long_matmul_announced_up_front(monkeypatch):
    monkeypatch.setattr(limits, "host_float64_flops", lambda: 50e9)
    timing = TimingConfig(max_time_s=5.0, min_warmup_calls=3)
    note = limits.cost_note(Matmul(20000).forward_size(1).flops, "float32", "cpu", True, timing)
    # the first call, calibration's, warm-up's one block (the budget cuts the rest) and one sample
    assert "one call ≈ 3 min" in note and "at least 4 calls ≈ 11 min" in note
    assert "float64 reference ≈ 5 min (check_reference=false skips it)" in note and "1.6e+13 FLOP" in note
    assert limits.cost_note(Matmul(1000).forward_size(1).flops, "float32", "cpu", True, timing) == ""
    flops = Matmul(20000).forward_size(1).flops
    assert "reference" not in limits.cost_note(flops, "float32", "cpu", False, timing)


def test_check_reference_false_skips_the_reference(make_config, tmp_path):
    from runner.measure.job import run_and_record
    from runner.record.naming import job_spec

    outcome = run_and_record(job_spec(make_config("tracking=none", "backend=numpy", "check_reference=false")), tmp_path)
    assert outcome.status == "FINISHED" and "max_abs_err_vs_reference" not in outcome.metrics
    outcome = run_and_record(job_spec(make_config("tracking=none", "backend=numpy")), tmp_path)
    assert "max_abs_err_vs_reference" in outcome.metrics


def test_a_generation_too_large_names_the_task_setting_at_fault(make_config):
    """task.new_tokens beyond the context is refused naming it, before the framework; a batch of generations beyond
    the machine's memory names task.new_tokens beside the model's sizes."""
    from runner.models import build_workload
    from runner.record.naming import job_spec
    from runner.tasks import build_task

    spec = job_spec(make_config("model=gpt2_small", "task=generate", "task.new_tokens=1000000000", "tracking=none"))
    workload, task = build_workload(spec.model_settings), build_task(spec.task_settings)
    with pytest.raises(ConfigError, match=r"^model.prompt_len \+ task.new_tokens: 1000000032 tokens do not fit"):
        task.check(workload)
    spec = job_spec(make_config("model=gpt2_small", "task=generate", "task.new_tokens=900", "batch_size=100000"))
    workload, task = build_workload(spec.model_settings), build_task(spec.task_settings)
    with pytest.raises(ConfigError, match=r"batch_size=100000 task.new_tokens=900 dtype=float32 needs about .* TB"):
        limits.check_fits(workload, spec, "cpu", task)


def test_each_task_scales_the_workloads_forward_to_its_own_call():
    """The memory check and the cost note of an MLP (32 -> 64 -> 2, batch 8), worked out by hand: a forward holds
    its outputs; a gradient the weights' size (per example in a per-example mode) at 3 forwards' cost; a jacobian
    each example's outputs by its inputs, at a forward and two per output."""
    mlp, batch = MLP(), 8
    weights, forward_flops = 64 * 33 + 2 * 64, 2.0 * 8 * 64 * (32 + 2)
    common = {"weights": weights, "inputs": batch * (32 + 2), "activations": 0}
    assert Inference("inference").array_elements(mlp, batch, False) == {**common, "results": batch * 2}
    assert Inference("inference").flops(mlp, batch) == forward_flops
    assert Gradients("gradients").array_elements(mlp, batch, False) == {**common, "results": weights}
    assert Gradients("gradients").array_elements(mlp, batch, True) == {**common, "results": batch * weights}
    assert Gradients("gradients").flops(mlp, batch) == 3 * forward_flops
    assert Jacobian("jacobian").array_elements(mlp, batch, False) == {**common, "results": batch * 2 * 32}
    assert Jacobian("jacobian").flops(mlp, batch) == (1 + 2 * 2) * forward_flops
    step = TrainStep("train_step", {"name": "sgd", "lr": 0.01, "momentum": 0.9})
    assert step.array_elements(mlp, batch, False) == Gradients("gradients").array_elements(mlp, batch, False)

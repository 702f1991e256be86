"""precision=: what cannot run is refused in one line before any framework is imported; bf16_mixed computes in
bfloat16 on float32 weights on the CPU for torch, TensorFlow and JAX; a run records its policy, what each framework
reports of its matmul precision, and the tolerance its reference check was held to."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from helpers import FAST_TIMING

from runner.config import PROJECT_ROOT, ConfigError, check_combination
from runner.measure.job import run_and_record
from runner.precision import REL_TOLERANCE, reference_tolerance
from runner.record.naming import job_spec

REFUSED = [
    (["backend=torch", "precision=tf32"],
     "precision=tf32 needs an NVIDIA GPU with TF32 (Ampere or newer); device=cpu has none"),
    (["backend=jax", "precision=fp16_mixed"], "precision=fp16_mixed runs on backend=torch or backend=tensorflow"),
    (["backend=tensorflow", "precision=fp16_mixed"], "precision=fp16_mixed needs an NVIDIA GPU"),
    (["backend=numpy", "precision=bf16_mixed"],
     "precision=bf16_mixed runs on backend=torch, tensorflow or jax; backend=numpy computes only precision=full"),
    (["backend=tnp", "precision=default"], "backend=tnp computes only precision=full"),
    (["backend=torch", "dtype=float64", "precision=bf16_mixed"],
     "precision=bf16_mixed keeps float32 weights: it needs dtype=float32, not dtype=float64"),
    (["backend=torch", "model=reshape", "task=inference", "precision=bf16_mixed"],
     "model=reshape runs only precision=full, not precision=bf16_mixed"),
]  # fmt: skip


def test_refusals_are_one_line_and_import_no_framework():
    """Composed and checked in a fresh process: the rules read conf/precision/*.yaml, never a framework."""
    script = textwrap.dedent(f"""
        import json, sys
        from runner.config import ConfigError, check_combination, compose
        said = []
        for overrides in {[o for o, _ in REFUSED]!r}:
            try:
                check_combination(compose(overrides))
                said.append(None)
            except ConfigError as error:
                said.append(str(error))
        print(json.dumps([said, sorted({{"torch", "tensorflow", "jax", "keras"}} & set(sys.modules))]))
    """)
    env = {**os.environ, "PYTHONPATH": str(PROJECT_ROOT / "src")}  # where Hydra finds the runner's launcher plugin
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    said, imported = json.loads(out.stdout.strip().splitlines()[-1])
    for (overrides, expected), message in zip(REFUSED, said, strict=True):
        assert message is not None and expected in message and "\n" not in message, (overrides, message)
    assert imported == []


def test_tf32_on_cpu_exits_with_one_line(cli, tmp_path):
    result = cli("tracking=none", f"hydra.run.dir={tmp_path}", "backend=torch", "precision=tf32")
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode == 2  # as docs/precision.md prints (its command runs as printed in the heavy set)
    assert lines == ["error: precision=tf32 needs an NVIDIA GPU with TF32 (Ampere or newer); device=cpu has none"]


def test_every_policy_may_run_somewhere(make_config):
    """Each conf/precision yaml passes the rules for at least one backend (the cuda-only ones where a GPU is)."""
    for precision in ("full", "default", "bf16_mixed"):
        for backend in ("torch", "tensorflow", "jax"):
            check_combination(make_config(f"backend={backend}", f"precision={precision}"))
    check_combination(make_config("backend=numpy", "precision=full"))
    with pytest.raises(ConfigError, match="device=cpu has none"):
        check_combination(make_config("backend=tensorflow", "precision=tf32"))


def test_tolerance_follows_the_compute_dtype():
    assert reference_tolerance("float64", "full", "cpu") == 1e-9
    assert reference_tolerance("float32", "full", "cuda") == 1e-5
    assert reference_tolerance("float32", "default", "cpu") == 1e-5
    assert reference_tolerance("float32", "default", "cuda") == REL_TOLERANCE["tfloat32"]  # TF32 as shipped
    assert reference_tolerance("float32", "bf16_mixed", "cpu") == REL_TOLERANCE["bfloat16"]
    assert reference_tolerance("float32", "fp16_mixed", "cuda") == REL_TOLERANCE["float16"]
    assert REL_TOLERANCE["float32"] < REL_TOLERANCE["float16"] < REL_TOLERANCE["bfloat16"]


def test_the_run_name_and_mlflow_note_say_the_policy_and_tolerance(make_config):
    from omegaconf import OmegaConf

    from runner.record.naming import run_name
    from runner.record.result import Result, Status
    from runner.tracking.run_page import note_content

    config = OmegaConf.to_container(make_config("backend=torch", "precision=bf16_mixed"), resolve=True)
    assert run_name(config) == "torch-mlp-gradients-eager-cpu-float32-bf16_mixed"
    assert (
        run_name(config, {"precision": "bf16_mixed"}) == "precision=bf16_mixed · torch-mlp-gradients-eager-cpu-float32"
    )
    assert run_name({**config, "precision": {"name": "full"}}) == "torch-mlp-gradients-eager-cpu-float32"
    result = Result(status=Status.FINISHED)
    result.config = config
    result.metrics = {"max_rel_err_vs_reference": 0.2, "reference_tolerance": 0.1, "within_reference_tolerance": 0.0}
    assert "max rel err vs the float64 reference 0.2 (beyond its tolerance 0.1)" in note_content(result)


def _run(make_config, tmp_path, name: str, *overrides: str):
    cfg = make_config("tracking=none", "isolation=inline", "model=mlp", *FAST_TIMING, *overrides)
    result = run_and_record(job_spec(cfg), tmp_path / name)
    assert result.status == "FINISHED", result.error
    return result


@pytest.mark.parametrize("backend", ["torch", "tensorflow", "jax"])
def test_bf16_mixed_runs_on_cpu_less_exact_than_full_and_within_its_tolerance(make_config, tmp_path, backend):
    for task in ("inference", "gradients"):
        full = _run(make_config, tmp_path, f"full-{task}", f"backend={backend}", f"task={task}")
        mixed = _run(
            make_config, tmp_path, f"bf16-{task}", f"backend={backend}", f"task={task}", "precision=bf16_mixed"
        )
        full_err, mixed_err = full.metrics["max_rel_err_vs_reference"], mixed.metrics["max_rel_err_vs_reference"]
        # bfloat16's 8-bit significand: errors far above float32's, which full stays within
        assert full_err < REL_TOLERANCE["float32"] < REL_TOLERANCE["float32"] * 100 < mixed_err, (task, mixed_err)
        assert mixed.metrics["reference_tolerance"] == REL_TOLERANCE["bfloat16"]
        assert mixed.metrics["within_reference_tolerance"] == 1.0
        assert full.metrics["reference_tolerance"] == 1e-5 and full.metrics["within_reference_tolerance"] == 1.0
        # the record keeps float32 arrays: results cast back from bfloat16, float32 weights
        assert mixed.tensors["weights/dense.weight"].dtype == np.float32
        assert mixed.environment["precision"] == "bf16_mixed"
        assert "bfloat16" in mixed.environment["precision_policy"]
        assert full.environment["precision_policy"] == "float32, TF32 off"
        if task == "gradients":  # the record's untimed forward pass is computed under the policy too
            y, y_mixed = full.tensors["outputs/y"], mixed.tensors["outputs/y"]
            assert REL_TOLERANCE["float32"] < np.abs(y_mixed - y).max() / np.abs(y).max() < REL_TOLERANCE["bfloat16"]


REPORTED = {  # what each framework reports of its float32 matmul precision under full
    "torch": ("torch_float32_matmul_precision", "highest"),
    "tensorflow": ("tf_tensor_float_32_execution", False),
    "jax": ("jax_default_matmul_precision", "highest"),
}


@pytest.mark.parametrize("backend", sorted(REPORTED))
def test_the_record_says_what_the_framework_reports(make_config, tmp_path, backend):
    key, under_full = REPORTED[backend]
    full = _run(make_config, tmp_path, "full", f"backend={backend}", "task=inference")
    assert full.environment[key] == under_full
    shipped = _run(make_config, tmp_path, "default", f"backend={backend}", "task=inference", "precision=default")
    assert shipped.environment["precision"] == "default" and key in shipped.environment
    if backend == "tensorflow":  # TensorFlow ships with TF32 execution on, whatever the device
        assert shipped.environment[key] is True
    again = _run(make_config, tmp_path, "full-again", f"backend={backend}", "task=inference")  # full sets it back
    assert again.environment[key] == under_full


def test_bf16_mixed_train_step_keeps_float32_weights_and_update(make_config, tmp_path):
    """torch.autocast around the loss only: backward and torch.optim's update run on the float32 weights, so the
    trained weights are float32 values that bfloat16 cannot hold."""
    import torch

    result = _run(make_config, tmp_path, "train", "backend=torch", "task=train_step", "precision=bf16_mixed")
    trained = result.tensors["trained/dense.weight"]
    assert trained.dtype == np.float32
    rounded = torch.from_numpy(trained).to(torch.bfloat16).float().numpy()
    assert np.mean(rounded != trained) > 0.9
    assert result.metrics["max_rel_err_vs_reference"] > REL_TOLERANCE["float32"]
    assert result.metrics["within_reference_tolerance"] == 1.0


@pytest.mark.parametrize("backend", ["torch", "tensorflow"])
def test_loss_scaled_training_steps_unscale_what_they_scale(make_config, tmp_path, monkeypatch, backend):
    """fp16_mixed's loss scaling (torch.amp.GradScaler, Keras's LossScaleOptimizer), run here in float32 on the CPU
    (its float16 compute needs a GPU): the scale (2**16, a power of two) is divided back out, so ten steps still
    land on the float64 reference within float32's tolerance."""
    from runner.backends import load_backend

    load_backend(f"runner.backends.{backend}_backend")
    module = sys.modules[
        {"torch": "runner.backends.torch_precision", "tensorflow": "runner.backends.tf_precision"}[backend]
    ]
    name = {"torch": "grad_scaler", "tensorflow": "loss_scaled"}[backend]
    made, real = [], getattr(module, name)
    monkeypatch.setattr(module, "LOSS_SCALED", ("full",))
    monkeypatch.setattr(module, name, lambda *args: made.append(real(*args)) or made[-1])
    result = _run(make_config, tmp_path, "scaled", f"backend={backend}", "task=train_step")
    assert type(made[0]).__name__ in ("GradScaler", "LossScaleOptimizer")
    assert result.metrics["max_rel_err_vs_reference"] < REL_TOLERANCE["float32"]


@pytest.mark.slow
def test_keras_applies_its_own_mixed_bfloat16_policy(make_config, tmp_path):
    """model=keras: Keras's mixed_bfloat16 policy (float32 variables, bfloat16 compute), not the runner's casts;
    its logits differ from the float32 run's by bfloat16's rounding, not more."""
    keras_run = ("backend=tensorflow", "model=keras", "task=inference", "batch_size=2", "data.image_size=32")
    full = _run(make_config, tmp_path, "full", *keras_run)
    mixed = _run(make_config, tmp_path, "bf16", *keras_run, "precision=bf16_mixed")
    assert (full.environment["keras_dtype_policy"], mixed.environment["keras_dtype_policy"]) == (
        "float32",
        "mixed_bfloat16",
    )
    y, y_mixed = full.tensors["outputs/y"], mixed.tensors["outputs/y"]
    assert y_mixed.dtype == np.float32
    difference = np.abs(y_mixed - y).max() / np.abs(y).max()
    assert REL_TOLERANCE["float32"] < difference < REL_TOLERANCE["bfloat16"], difference

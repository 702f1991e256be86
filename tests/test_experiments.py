"""Every experiment file runs with the command its header prints last (its small grid, as CI can afford),
as printed, and shows what the seed was about."""

from __future__ import annotations

import re

import pytest
from test_readme_commands import experiment_checked_commands, n_jobs, run_as_printed

from runner.config import PROJECT_ROOT, nvidia_driver_present

COMMANDS = experiment_checked_commands()


def test_every_experiment_file_has_a_command_ci_can_afford():
    assert set(COMMANDS) == {path.stem for path in (PROJECT_ROOT / "experiments").glob("*.yaml")}
    assert all(n_jobs(command) <= 16 for command in COMMANDS.values())


# Experiments whose grids check nothing beyond every job finishing and the comparison printed, on models the default
# set runs in-process on each backend: the heavy set (CI runs it after the default set) runs them as printed, which
# keeps the default set short on 2 cores (each takes 25-60 s of it on a busy machine).
COVERED_IN_PROCESS = {
    "per_example_gradients": "test_vision.py::test_per_example_gradients_of_a_convnet, test_numerics.py",
    "resnet_inference": "test_vision.py::test_torch_and_other_backends_outputs_agree",
    "transformer": "test_transformer.py::test_float64_agrees_with_the_reference",
    "sigmoid_scaling": "test_numerics.py::test_op_workloads, test_jax.py, test_lasting_record.py (a size sweep)",
    "tf_function_speedup": "test_numerics.py (gradients in every mode), test_train_step.py",
    "horse2zebra": "test_vision.py::test_cyclegan_on_an_image_writes_png",
    "tensor_conversion": "test_numerics.py::test_the_conversion_and_reshape_variants_say_whether_they_copy",
    "view_vs_reshape": "test_numerics.py::test_the_conversion_and_reshape_variants_say_whether_they_copy",
    "generation": "test_generation.py::test_every_backend_generates_the_reference_tokens",
    "cpu_vs_gpu_matmul": (
        "test_numerics.py::test_op_workloads (the matmul on each backend), test_gpu.py (the matmul on cuda)"
    ),
}


@pytest.fixture(scope="module")
def scratch(tmp_path_factory):
    return tmp_path_factory.mktemp("user")


@pytest.mark.parametrize(
    "name", [pytest.param(n, marks=[pytest.mark.heavy] * (n in COVERED_IN_PROCESS)) for n in sorted(COMMANDS)]
)
def test_experiment_runs_as_one_command(scratch, tmp_path, name):
    result, results = run_as_printed(COMMANDS[name], scratch, tmp_path)
    assert all(r["status"] == "FINISHED" for r in results)
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
    if name == "generation":
        assert all(r["metrics"]["tokens_differ"] == 0 for r in results)
        # the answer names a time per token: the fastest's, or each one's where its order is not reliable
        assert re.search(r" a generation, [\d.]+ .?s a token[);]", result.stdout), result.stdout[-2000:]
    if name == "horse2zebra":
        assert all((tmp_path / "sweep" / str(job) / "images" / "000.png").exists() for job in range(len(results)))


def test_the_summary_script_the_docs_name_prints_a_sweeps_table(cli, tmp_path):
    """experiments/summarize.py, as docs/experiments.md and experiments/README.md print it (issue 74: it called
    functions that were removed, and no test ran it)."""
    import subprocess
    import sys

    from helpers import FAST_TIMING

    sweep = tmp_path / "sweep"
    made = cli("-m", "backend=numpy", "seed=0,1", "tracking=none", f"hydra.sweep.dir={sweep}", *FAST_TIMING)
    assert made.returncode == 0, made.stderr[-2000:]
    script = [sys.executable, str(PROJECT_ROOT / "experiments" / "summarize.py")]
    done = subprocess.run([*script, str(sweep)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    rows = [line for line in done.stdout.splitlines() if line.startswith("| ") and "FINISHED" in line]
    assert len(rows) == 2 and done.stdout.startswith("| run | status |")
    refused = subprocess.run([*script, str(tmp_path / "none")], capture_output=True, text=True, timeout=120)
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1 and "usage:" in refused.stderr

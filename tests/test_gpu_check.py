"""scripts/gpu-check.sh on any machine: its dry run says what it would install and run, without a GPU it says so
in one line and exits 0; its summary (scripts/gpu_check_summary.py) is built here from what the steps leave.
The cuda run itself is the `gpu` set's (tests/test_gpu.py), on a GPU machine."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from runner.config import PROJECT_ROOT

SCRIPT = PROJECT_ROOT / "scripts" / "gpu-check.sh"
WHEELS = ("hydra_core-1.3.2-py3-none-any.whl", "mlflow-3.1.0-py3-none-any.whl")


def check(*args: str, **env: str) -> subprocess.CompletedProcess:
    """The script as a user runs it, never with the $OUT of a machine that returns files (env overrides)."""
    base = {k: v for k, v in os.environ.items() if k not in ("OUT", "GPU_CHECK_WHEELS", "NVIDIA_SMI", "PYTHON")}
    return subprocess.run(
        ["bash", str(SCRIPT), *args], env={**base, **env}, capture_output=True, text=True, timeout=120, cwd="/"
    )


def load_module(path: Path):
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def wheels(tmp_path):
    folder = tmp_path / "whl"
    folder.mkdir()
    for name in WHEELS:
        (folder / name).write_bytes(b"")
    return folder


def test_dry_run_says_what_it_would_install_and_run(tmp_path, wheels):
    out = tmp_path / "out"
    done = check("--dry-run", "--out", str(out), GPU_CHECK_WHEELS=str(wheels))
    assert done.returncode == 0, done.stderr
    said = done.stdout
    lines = said.splitlines()
    install = next(line for line in lines if " -m pip install " in line)
    assert "--no-index --no-deps" in install and "--target " in install
    assert all(f"{wheels}/{name}" in install for name in WHEELS)
    assert f"install {len(WHEELS)} wheels from {wheels}/" in said
    pytest_line = next(line for line in lines if " -m pytest " in line)
    assert " -m gpu " in pytest_line and f"--junitxml={out}/pytest-gpu.xml" in pytest_line
    sweep = next(line for line in lines if " run.py -m " in line)
    for part in ("backend=torch", "device=cuda", "dtype=float32,bfloat16", "tracking.uri=sqlite:///"):
        assert part in sweep
    parity_lines = [line for line in lines if "benchmarks/parity.py --device cuda" in line]
    assert len(parity_lines) == 2
    rows = [line.split("--rows ")[1].split()[0].split(",") for line in parity_lines]
    parity = load_module(PROJECT_ROOT / "benchmarks" / "parity.py")
    assert sorted(rows[0] + rows[1]) == sorted(parity.WORKLOADS)  # every parity row, each once
    assert f"write {out}/summary.md" in said
    assert not out.exists()  # a dry run writes nothing


def test_only_runs_the_steps_it_names_and_refuses_a_step_it_does_not_know(tmp_path):
    """--only compiled,generation: what a whole check leaves no time for, in a short second call on a lent GPU."""
    done = check("--dry-run", "--only", "compiled,generation", GPU_CHECK_WHEELS=str(tmp_path / "none"))
    assert done.returncode == 0, done.stderr
    steps = [line for line in done.stdout.splitlines() if line.startswith("  [")]
    assert len(steps) == 3 and "parity.py --device cuda" in steps[0] and "gpt2_generate_eager" in steps[0]
    assert all("task=generate device=cuda model=llama_32_1b" in s for s in steps[1:])
    assert "backend=torch mode=eager,function" in steps[1] and "backend=jax mode=function" in steps[2]
    assert " -m pytest " not in done.stdout and "model=matmul" not in done.stdout
    refused = check("--only", "pytest,bench", GPU_CHECK_WHEELS=str(tmp_path / "none"))
    assert refused.returncode == 2 and refused.stdout == ""
    assert refused.stderr.strip() == (
        "gpu-check: no step 'bench' (--only takes steps of sweep,parity,pytest,compiled,generation,alone)"
    )


def test_dry_run_without_wheels_and_the_output_folder_it_picks(tmp_path):
    done = check("--dry-run", GPU_CHECK_WHEELS=str(tmp_path / "none"))
    assert done.returncode == 0, done.stderr
    assert f"install nothing: no wheels in {tmp_path / 'none'}/" in done.stdout
    assert f"write {PROJECT_ROOT}/outputs/gpu-check/summary.md" in done.stdout  # the default
    returned = check("--dry-run", "--out", str(tmp_path / "b"), OUT=str(tmp_path / "a"))
    assert f"write {tmp_path / 'a'}/summary.md" in returned.stdout  # $OUT: the folder a GPU machine sends back


def test_without_a_gpu_one_line_and_exit_0(tmp_path):
    out = tmp_path / "out"
    done = check("--out", str(out), NVIDIA_SMI=str(tmp_path / "no-nvidia-smi"))
    assert done.returncode == 0
    assert done.stdout.splitlines() == [f"gpu-check: no GPU here (no {tmp_path / 'no-nvidia-smi'}): nothing to check"]
    assert done.stderr == "" and not out.exists()
    lists_none = tmp_path / "nvidia-smi"
    lists_none.write_text("#!/bin/sh\nexit 9\n")
    lists_none.chmod(0o755)
    done = check("--out", str(out), NVIDIA_SMI=str(lists_none))
    assert (done.returncode, len(done.stdout.splitlines()), done.stderr) == (0, 1, "")
    assert "no GPU here" in done.stdout and not out.exists()


def test_a_driver_but_no_cuda_for_torch_is_no_gpu(tmp_path):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("torch sees a GPU here: the check would run")
    fake = tmp_path / "nvidia-smi"
    fake.write_text("#!/bin/sh\necho 'GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-0)'\n")
    fake.chmod(0o755)
    done = check("--out", str(tmp_path / "out"), NVIDIA_SMI=str(fake), PYTHON=sys.executable)
    assert done.returncode == 0 and done.stderr == ""
    assert done.stdout.splitlines() == [
        f"gpu-check: no GPU here for torch ({sys.executable}: torch missing or torch.cuda.is_available() is False): "
        "nothing to check"
    ]


JUNIT = """<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest" tests="3">
<testcase classname="tests.test_gpu" name="test_cuda_torch_compile" time="12.5"/>
<testcase classname="tests.test_gpu" name="test_cuda_policy[torch-fp16_mixed]" time="0.1">
<failure message="AssertionError: 0.0 == 1.0 | within">trace</failure></testcase>
<testcase classname="tests.test_gpu" name="test_tensorflow_on_cuda_where_it_sees_the_gpu" time="0.0">
<skipped type="pytest.skip" message="TensorFlow is not installed here">skip</skipped></testcase>
<testcase time="0.000" />
</testsuite></testsuites>
"""


def _job(folder: Path, dtype: str, gflops: float) -> None:
    folder.mkdir(parents=True)
    saved = {
        "status": "FINISHED",
        "config": {"dtype": dtype, "model": {"name": "matmul", "n": 8192}},
        "metrics": {
            "time_median_s": 2 * 8192**3 / gflops / 1e9,
            "gflops_per_s": gflops,
            "max_rel_err_vs_reference": 1e-3,
        },
        "environment": {
            "framework": "torch",
            "framework_version": "2.11.0",
            "cuda_version": "13.0",
            "python": "3.12.3",
        },
    }
    (folder / "result.json").write_text(json.dumps(saved))


def test_the_summary_from_what_the_steps_left(tmp_path):
    work, out = tmp_path / "work", tmp_path / "out"
    work.mkdir()
    out.mkdir()
    (work / "nvidia-smi.csv").write_text("NVIDIA H100 80GB HBM3, 580.65.06, 81559 MiB, 9.0\n")
    (work / "steps.tsv").write_text("tracked sweep\t0\t40\t75\nparity rows\t0\t60\t90\npytest -m gpu\t124\t300\t300\n")
    (out / "pytest-gpu.xml").write_text(JUNIT)
    collected = ["test_cuda_torch_compile", "test_cuda_policy[torch-fp16_mixed]", "test_cuda_graphs_output_read"]
    (work / "collected.txt").write_text("".join(f"tests/test_gpu.py::{name}\n" for name in collected) + "3 tests\n")
    (work / "parity.md").write_text(
        "<!-- parity:begin -->\n| backend | device | workload | ratio |\n|---|---|---|---|\n"
        "| torch | cuda (NVIDIA H100 80GB HBM3) | matmul | **1.002** |\n<!-- parity:end -->\n"
    )
    _job(work / "sweep" / "0", "float32", 50_000)
    _job(work / "sweep" / "1", "bfloat16", 700_000)
    (work / "sweep" / "summary.md").write_text("# Sweep summary\n\n**bfloat16 fastest (1.57 ms); float32 14x**\n")
    summary = load_module(PROJECT_ROOT / "scripts" / "gpu_check_summary.py")
    assert summary.main(["--work", str(work), "--out", str(out)]) == 0
    text = (out / "summary.md").read_text()
    assert "GPU: name NVIDIA H100 80GB HBM3, driver 580.65.06" in text
    assert "torch 2.11.0, CUDA 13.0" in text
    assert "| pytest -m gpu | 124 (stopped at its limit) | 300 | 300 |" in text
    assert "pytest was stopped at its limit: the tests it collected and did not report are listed" in text
    assert "## pytest -m gpu: 1 passed, 1 failed, 0 errors, 1 skipped, 1 not finished" in text
    assert "| test_gpu::test_cuda_graphs_output_read | not finished |  |  |" in text
    lines = text.splitlines()
    failed = next(i for i, line in enumerate(lines) if "test_cuda_policy[torch-fp16_mixed]" in line)
    assert failed < next(i for i, line in enumerate(lines) if "test_cuda_torch_compile" in line)  # failures first
    assert "AssertionError: 0.0 == 1.0 \\| within" in lines[failed]
    assert (
        "| test_gpu::test_tensorflow_on_cuda_where_it_sees_the_gpu | skipped | TensorFlow is not installed here |"
        in text
    )
    assert "| torch | cuda (NVIDIA H100 80GB HBM3) | matmul | **1.002** |" in text
    assert "Answer line: **bfloat16 fastest (1.57 ms); float32 14x**" in text
    assert "bfloat16 matmul (n=8192): 700 TFLOP/s, 71% of the 989.4 TFLOP/s dense bf16 peak" in text


def test_the_summary_says_what_is_missing(tmp_path):
    summary = load_module(PROJECT_ROOT / "scripts" / "gpu_check_summary.py")
    assert summary.main(["--work", str(tmp_path), "--out", str(tmp_path)]) == 0
    text = (tmp_path / "summary.md").read_text()
    assert "nvidia-smi said nothing" in text and "No pytest-gpu.xml" in text
    assert "No parity rows" in text and "No result.json" in text


def test_the_bf16_peak_follows_the_gpus_name():
    summary = load_module(PROJECT_ROOT / "scripts" / "gpu_check_summary.py")
    assert summary.bf16_peak("NVIDIA H100 80GB HBM3") == 989.4
    assert summary.bf16_peak("NVIDIA H100 PCIe") == 756.0
    assert summary.bf16_peak("NVIDIA H200") == 989.4
    assert summary.bf16_peak("NVIDIA L40S") == 362.0 and summary.bf16_peak("NVIDIA L4") == 121.0
    assert summary.bf16_peak("Tesla T4") is None

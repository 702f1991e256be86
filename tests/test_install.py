"""What `pip install -e '.[EXTRA]'` would install: the extras resolve beside the project's pins (needs PyPI)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from runner.config import PROJECT_ROOT


def dry_run(requirement: str, report_path) -> dict[str, str]:
    """name -> version of everything pip would install for requirement into an empty environment."""
    out = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet"]
        + ["--report", str(report_path), requirement],
        capture_output=True,
        text=True,
        timeout=1200,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads(report_path.read_text())
    return {item["metadata"]["name"].lower(): item["metadata"]["version"] for item in report["install"]}


@pytest.mark.slow
def test_the_cuda_extra_resolves_gpu_tensorflow_beside_torch(tmp_path):
    """About 2-3 minutes: pip reads the metadata of ~70 packages, CUDA 12 and CUDA 13 libraries included."""
    resolved = dry_run(f"{PROJECT_ROOT}[cuda]", tmp_path / "report.json")
    assert resolved["torch"] == "2.14.1" and "tensorflow" in resolved
    assert {"nvidia-cudnn-cu12", "nvidia-cublas-cu12", "nvidia-cuda-runtime-cu12"} <= resolved.keys()  # for TF
    assert "nvidia-ml-py" in resolved  # NVML's energy counter
    assert any(name.startswith("nvidia-cudnn-cu13") for name in resolved)  # torch 2.14.1's own

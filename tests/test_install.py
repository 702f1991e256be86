"""What an install gives: the wheel runs experiments from any folder with the configs it ships; what
`pip install -e '.[EXTRA]'` would install: the extras resolve beside the project's pins (needs PyPI)."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import uuid
import zipfile
from pathlib import Path

import pytest
from helpers import FAST_TIMING

from runner.config import PROJECT_ROOT

# What the wheel is built from: copied, so the build's folders (build/, *.egg-info) stay out of the repository.
SOURCES = ("pyproject.toml", "setup.py", "README.md", "LICENSE", "src", "conf", "experiments")


def build_wheel(folder: Path) -> Path:
    """tensor-runner's wheel, built from a copy of the sources into folder/dist."""
    source = folder / "source"
    ignore = shutil.ignore_patterns("__pycache__", "*.egg-info")
    source.mkdir(parents=True)
    for name in SOURCES:
        path = PROJECT_ROOT / name
        if path.is_dir():
            shutil.copytree(path, source / name, symlinks=True, ignore=ignore)
        else:
            shutil.copy2(path, source / name)
    # The build backend of this environment where it has one (setuptools), else one pip fetches (needs PyPI).
    flags = ["--no-build-isolation"] if importlib.util.find_spec("setuptools") else []
    out = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", *flags, "-w", str(folder / "dist"), str(source)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return next((folder / "dist").glob("tensor_runner-*.whl"))


def fresh_venv(folder: Path, wheel: Path) -> Path:
    """A new virtual environment holding the wheel; its dependencies (torch, MLflow ...) are this environment's,
    reached through a .pth file: a path entry, so this environment's editable install (src/) stays out."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(folder)], check=True, timeout=300)
    python = folder / "bin" / "python"
    site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    Path(site, "dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    out = subprocess.run(
        # --ignore-installed: pip sees this environment's tensor-runner through the .pth and must leave it alone
        [sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "--ignore-installed", "-q"]
        + [str(wheel)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return folder / "bin"


def test_the_installed_wheel_runs_an_experiment_from_an_empty_folder(tmp_path):
    """`tensor-runner backend=numpy` from an empty folder, with the wheel installed in a fresh environment: the
    packaged configs compose, and the run, its default MLflow store included, lands in ./outputs there."""
    wheel = build_wheel(tmp_path / "build")
    with zipfile.ZipFile(wheel) as archive:
        shipped = set(archive.namelist())
    code = {p.relative_to(PROJECT_ROOT / "src").as_posix() for p in PROJECT_ROOT.glob("src/*/**/*.py")}
    code.add("runner/models/imagenet_classes.txt")
    assert not sorted(code - shipped), f"the wheel lacks these files of src/: {sorted(code - shipped)}"
    configs = {p.relative_to(PROJECT_ROOT / "conf") for p in PROJECT_ROOT.glob("conf/**/*.yaml")}
    configs |= {Path("experiment", p.name) for p in PROJECT_ROOT.glob("experiments/*.yaml")}  # conf/experiment
    missing = sorted(str(p) for p in configs if f"tensor_runner_conf/{p.as_posix()}" not in shipped)
    assert not missing, f"the wheel lacks these configs of conf/: {missing}"

    bin_dir = fresh_venv(tmp_path / "venv", wheel)
    work = tmp_path / "work"
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHONPATH", "MLFLOW_"))}
    marker = f"wheel-{uuid.uuid4().hex[:8]}"
    where = subprocess.run(
        [str(bin_dir / "python"), "-c", "import runner, tensor_runner_conf; print(runner.__file__)"],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert where.returncode == 0, where.stderr[-2000:]
    assert Path(where.stdout.strip()).is_relative_to(tmp_path / "venv"), f"runner came from {where.stdout}"

    before = set(PROJECT_ROOT.glob("outputs/runs/*/*"))
    result = subprocess.run(
        [str(bin_dir / "tensor-runner"), "backend=numpy", f"tracking.experiment={marker}", *FAST_TIMING],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    records = list(work.glob("outputs/runs/*/*/result.json"))
    assert len(records) == 1, sorted(p.relative_to(work) for p in work.rglob("*"))
    record = json.loads(records[0].read_text())
    assert record["status"] == "FINISHED" and record["config"]["backend"]["name"] == "numpy"
    assert record["config"]["tracking"]["uri"] == f"sqlite:///{work}/outputs/mlflow.db"
    assert (work / "outputs" / "mlflow.db").is_file()
    assert record["environment"]["git_commit"] == "unknown"  # the installed runner has no checkout to name
    assert (records[0].parent / "run.log").exists()  # the job's name is run, as from run.py
    for new in set(PROJECT_ROOT.glob("outputs/runs/*/*")) - before:  # other runs may land there meanwhile
        assert marker not in (new / ".hydra" / "overrides.yaml").read_text(errors="replace"), new

    # A ready-made experiment of experiments/ and a bad value, through the configs the wheel ships
    shown = subprocess.run(
        [str(bin_dir / "python"), "-m", "runner", "run", "+experiment=sigmoid_scaling", "--cfg", "job"],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert shown.returncode == 0 and "sigmoid" in shown.stdout, shown.stderr[-2000:]
    refused = subprocess.run(
        [str(bin_dir / "tensor-runner"), "backend=nope"], cwd=work, env=env, capture_output=True, text=True, timeout=300
    )
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1, refused.stderr[-2000:]
    assert "backend=nope is not an option" in refused.stderr
    assert sorted(p.name for p in work.iterdir()) == ["outputs"]


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


def test_the_set_up_command_runs_a_sweep_with_the_runners_launcher_from_another_folder(tmp_path):
    """setup.sh's editable install maps the package through an import hook that Hydra's plugin scan cannot list:
    `tensor-runner -m` must still find the default launcher (hydra/launcher=rounds), with no PYTHONPATH help."""
    command = Path(sys.executable).parent / "tensor-runner"
    if not command.exists():
        pytest.skip("no tensor-runner beside this Python: ./setup.sh installs it")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    sweep = ["-m", "backend=numpy", "seed=0,1", "tracking=none", f"hydra.sweep.dir={tmp_path}/sweep", *FAST_TIMING]
    result = subprocess.run([str(command), *sweep], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert sorted(p.parent.name for p in (tmp_path / "sweep").glob("*/result.json")) == ["0", "1"]


@pytest.mark.slow
def test_the_cuda_extra_resolves_gpu_tensorflow_beside_torch(tmp_path):
    """About 2-3 minutes: pip reads the metadata of ~70 packages, CUDA 12 and CUDA 13 libraries included."""
    resolved = dry_run(f"{PROJECT_ROOT}[cuda]", tmp_path / "report.json")
    assert resolved["torch"] == "2.14.1" and "tensorflow" in resolved
    assert {"nvidia-cudnn-cu12", "nvidia-cublas-cu12", "nvidia-cuda-runtime-cu12"} <= resolved.keys()  # for TF
    assert "nvidia-ml-py" in resolved  # NVML's energy counter
    assert any(name.startswith("nvidia-cudnn-cu13") for name in resolved)  # torch 2.14.1's own

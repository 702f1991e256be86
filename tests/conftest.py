"""Shared fixtures: compose configs in-process, run the CLI in a subprocess."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra

from runner.config import PROJECT_ROOT

FAST_TIMING = ["timing.warmup_s=0.01", "timing.min_repeats=3", "timing.max_time_s=0.2", "timing.min_block_s=0.0005"]


def compose_config(*overrides: str):
    """The resolved run config for these overrides, composed as `python run.py` would."""
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(PROJECT_ROOT / "conf"), version_base="1.3"):
        return compose(config_name="config", overrides=[*FAST_TIMING, *overrides])


@pytest.fixture
def make_config():
    return compose_config


def run_cli(*args: str, cwd: Path = PROJECT_ROOT, timeout: int = 300) -> subprocess.CompletedProcess:
    """`python run.py ARGS` in a subprocess, as a user runs it."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(PROJECT_ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run(
        [sys.executable, str(PROJECT_ROOT / "run.py"), *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.fixture
def cli():
    return run_cli

"""Code shared by the test modules: compose a config as run.py would, run the CLIs as a user does."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

from runner.config import PROJECT_ROOT, compose

PROGRESS = re.compile(r"^  \S.*(s so far\)|s left)$")  # a job's phase and sampling lines on stderr, not messages
FAST_TIMING = ["timing.warmup_s=0.01", "timing.min_repeats=3", "timing.max_time_s=0.2", "timing.min_block_s=0.0005"]


def compose_config(*overrides: str):
    """The resolved run config for these overrides (with a fast timing budget), composed in this process."""
    return compose([*FAST_TIMING, *overrides])


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(PROJECT_ROOT / "src"), os.environ.get("PYTHONPATH", "")])}


def run_cli(*args: str, cwd: Path = PROJECT_ROOT, timeout: int = 300) -> subprocess.CompletedProcess:
    """`python run.py ARGS` in a subprocess, as a user runs it."""
    return subprocess.run(
        [sys.executable, str(PROJECT_ROOT / "run.py"), *args],
        cwd=cwd,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def runner_cli(*args: str) -> subprocess.CompletedProcess:
    """`python -m runner ARGS`, as the `runner` console script runs."""
    return subprocess.run(
        [sys.executable, "-m", "runner", *args], env=_env(), capture_output=True, text=True, timeout=300
    )


def sweep_cli(tmp: Path, *overrides: str, timeout: int = 300) -> subprocess.CompletedProcess:
    """`python run.py -m OVERRIDES` into tmp/sweep, tracked in tmp/mlflow.db."""
    return run_cli(
        "-m",
        f"tracking.uri=sqlite:///{tmp}/mlflow.db",
        "tracking.experiment=sweeps",
        f"hydra.sweep.dir={tmp}/sweep",
        *FAST_TIMING,
        *overrides,
        timeout=timeout,
    )


def results(tmp: Path) -> dict[str, dict]:
    """The result.json of each job of the sweep in tmp/sweep, by job number."""
    return {p.parent.name: json.loads(p.read_text()) for p in sorted((tmp / "sweep").glob("*/result.json"))}


def clients(uri: str, experiment: str):
    """(client, parent runs, child runs) of an experiment."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    runs = client.search_runs([client.get_experiment_by_name(experiment).experiment_id])
    return client, [r for r in runs if "sweep_dir" in r.data.tags], [r for r in runs if "sweep_dir" not in r.data.tags]


def mlflow_runs(tmp: Path, experiment: str = "sweeps") -> tuple[list, list]:
    """(parent runs, child runs) of the experiment in tmp/mlflow.db."""
    _, parents, children = clients(f"sqlite:///{tmp}/mlflow.db", experiment)
    return parents, children


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]

"""Code shared by the test modules: compose a config as run.py would, run the CLIs as a user does."""

from __future__ import annotations

import atexit
import contextlib
import functools
import io
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from runner.config import PROJECT_ROOT, compose

PROGRESS = re.compile(r"^  \S.*(s so far\)|s left)$")  # a job's phase and sampling lines on stderr, not messages
FAST_TIMING = ["timing.warmup_s=0.01", "timing.min_repeats=3", "timing.max_time_s=0.2", "timing.min_block_s=0.0005"]


def compose_config(*overrides: str):
    """The resolved run config for these overrides (with a fast timing budget), composed in this process."""
    return compose([*FAST_TIMING, *overrides])


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(PROJECT_ROOT / "src"), os.environ.get("PYTHONPATH", "")])}


def run_cli(
    *args: str,
    cwd: Path = PROJECT_ROOT,
    timeout: int = 300,
    env: dict[str, str] | None = None,
    run_py: Path = PROJECT_ROOT / "run.py",
) -> subprocess.CompletedProcess:
    """`python run.py ARGS` in a subprocess, as a user runs it (with these environment variables added)."""
    return subprocess.run(
        [sys.executable, str(run_py), *args],
        cwd=cwd,
        env={**_env(), **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def generate_cli(run_dir: Path, *overrides: str) -> tuple[dict, Any]:
    """`python run.py task=generate OVERRIDES` into run_dir (tracking off, a fast timing budget), as a user runs it:
    its result.json and its tokens (outputs/tokens: batch x new tokens)."""
    import h5py

    out = run_cli("task=generate", *overrides, "tracking=none", f"hydra.run.dir={run_dir}", *FAST_TIMING, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    saved = json.loads((run_dir / "result.json").read_text())
    with h5py.File(run_dir / "tensors.h5", "r") as f:
        return saved, f["outputs/tokens"][()]


def decided_tokens(saved: dict, tokens: Any) -> int:
    """How many leading tokens a generation's reference decided (first_undecided_token; -1: all of them)."""
    first = int(saved["metrics"]["first_undecided_token"])
    return tokens.shape[1] if first < 0 else first


def runner_cli(*args: str) -> subprocess.CompletedProcess:
    """`python -m runner ARGS`, as the `runner` console script runs."""
    return subprocess.run(
        [sys.executable, "-m", "runner", *args], env=_env(), capture_output=True, text=True, timeout=300
    )


def runner_main(*args: str) -> subprocess.CompletedProcess:
    """`runner ARGS` in this process (runner.cli.main), with what runner_cli returns: its exit status, stdout and
    stderr, without the seconds a fresh interpreter takes to import MLflow. The command itself starts as a process in
    test_help.py (--version) and test_readme_commands.py (each subcommand's --help)."""
    from runner import cli

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            status = cli.main(list(args))
        except SystemExit as exit:  # argparse's refusals
            status = exit.code if isinstance(exit.code, int) else 1
    return subprocess.CompletedProcess(["runner", *args], status, out.getvalue(), err.getvalue())


@functools.cache
def _store_with_tables() -> Path:
    """An MLflow SQLite store whose tables exist, made once a test session (MLflow's migrations take seconds)."""
    from runner import tracking

    folder = Path(tempfile.mkdtemp(prefix="runner-test-store-"))
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    tracking.open_store(f"sqlite:///{folder / 'mlflow.db'}")
    return folder / "mlflow.db"


def made_store(folder: Path) -> str:
    """The URI of folder/mlflow.db, made beforehand (a copy of an empty store with its tables): for tests of what runs
    and sweeps record, not of how a new store is created (test_nothing_lost.py, test_recording.py's tracked runs and
    the joblib sweep's create theirs)."""
    folder.mkdir(parents=True, exist_ok=True)
    if not (folder / "mlflow.db").exists():
        shutil.copyfile(_store_with_tables(), folder / "mlflow.db")
    return f"sqlite:///{folder / 'mlflow.db'}"


def sweep_cli(tmp: Path, *overrides: str, timeout: int = 300, new_store: bool = False) -> subprocess.CompletedProcess:
    """`python run.py -m OVERRIDES` into tmp/sweep, tracked in tmp/mlflow.db (made beforehand, unless new_store)."""
    if not new_store:
        made_store(tmp)
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


def identified(frame):
    """A frame of runs made by hand, with the columns runner.report.frame adds from each run (runner.record.runs):
    its identity's keys computed from its params.* columns, and whether it is timed."""
    import pandas as pd

    from runner import identity
    from runner.record.result import Status

    params = [
        {str(k).removeprefix("params."): v for k, v in row.items() if str(k).startswith("params.") and pd.notna(v)}
        for _, row in frame.iterrows()
    ]
    frame = frame.copy()
    frame["work"] = [identity.work(p).key for p in params]
    frame["configuration"] = [identity.configuration(p).key for p in params]
    frame["case"] = [identity.case(p).key for p in params]
    frame["timed"] = (frame["status"] == Status.FINISHED) & frame["metrics.time_median_s"].notna()
    return frame

"""Scale-out: runs logged to a real `mlflow server` on loopback (its own SQLite store, a free port)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from helpers import FAST_TIMING, clients, free_port, run_cli, runner_cli

from runner.config import PROJECT_ROOT

pytestmark = pytest.mark.slow  # an mlflow server takes 10-20 s to start


def start_server(tmp: Path, port: int) -> subprocess.Popen:
    mlflow = Path(sys.executable).parent / "mlflow"
    server = subprocess.Popen(
        [str(mlflow), "server", "--backend-store-uri", f"sqlite:///{tmp}/server.db"]
        + ["--artifacts-destination", str(tmp / "artifacts"), "--host", "127.0.0.1", "--port", str(port)]
        + ["--workers", "1"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1).close()
            return server
        except OSError:
            time.sleep(0.25)
    stop_server(server)
    raise AssertionError("mlflow server did not start")


def stop_server(server: subprocess.Popen) -> None:
    os.killpg(server.pid, signal.SIGTERM)  # its own session: the server and its uvicorn workers
    server.wait(timeout=60)


def test_runs_reach_a_real_server_and_runs_made_while_it_was_down_arrive_after_sync(tmp_path):
    port = free_port()
    uri = f"http://127.0.0.1:{port}"
    server = start_server(tmp_path, port)
    try:
        result = run_cli("-m", f"tracking.uri={uri}", f"hydra.sweep.dir={tmp_path}/up", *FAST_TIMING, "backend=numpy")
        assert result.returncode == 0, result.stderr[-3000:]
        client, (parent,), (child,) = clients(uri, "tensor-runner")
        assert child.info.status == "FINISHED" and child.data.tags["mlflow.parentRunId"] == parent.info.run_id
        assert {"result.json", "tensors.h5"} <= {a.path for a in client.list_artifacts(child.info.run_id)}
    finally:
        stop_server(server)

    down_dir = tmp_path / "down"
    result = run_cli("backend=numpy", f"tracking.uri={uri}", f"hydra.run.dir={down_dir}", *FAST_TIMING)
    assert result.returncode == 0 and "runner sync" in result.stderr
    assert json.loads((down_dir / "result.json").read_text())["status"] == "FINISHED"

    server = start_server(tmp_path, port)
    try:
        result = runner_cli("sync", str(down_dir))
        assert result.returncode == 0 and "uploaded as run" in result.stdout, result.stderr[-3000:]
        _, _, children = clients(uri, "tensor-runner")
        assert len(children) == 2 and {c.info.status for c in children} == {"FINISHED"}
    finally:
        stop_server(server)


@pytest.mark.heavy
def test_a_server_stopped_mid_sweep_and_the_printed_hint_followed_leave_every_run_and_the_parent_finished(tmp_path):
    """The server stops while a sweep's jobs run: the sweep keeps its runs and prints one hint, `runner sync
    SWEEP_DIR`; with the server back, that command as printed leaves both children and their parent FINISHED."""
    port = free_port()
    uri = f"http://127.0.0.1:{port}"
    server = start_server(tmp_path, port)
    command = [sys.executable, str(PROJECT_ROOT / "run.py"), "-m", f"tracking.uri={uri}", *FAST_TIMING]
    command += [f"hydra.sweep.dir={tmp_path}/sweep", "model=matmul", "task=inference", "backend=numpy,torch"]
    command += ["timing.max_time_s=5"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(PROJECT_ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    sweep = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 300
        while len(list((tmp_path / "sweep").glob("*/job.log"))) < 2 and time.monotonic() < deadline:
            time.sleep(0.5)
        assert sweep.poll() is None, sweep.communicate()
        stop_server(server)  # mid-sweep: the parent is in the store, the jobs are timing
        out, err = sweep.communicate(timeout=600)
    finally:
        if sweep.poll() is None:
            sweep.kill()
    hints = sorted({line.split("upload them later with: ")[1] for line in err.splitlines() if "later with: " in line})
    assert hints == [f"runner sync {tmp_path / 'sweep'}"], out[-2000:] + err[-3000:]
    assert [json.loads(p.read_text())["status"] for p in sorted((tmp_path / "sweep").glob("*/result.json"))] == [
        "FINISHED"
    ] * 2
    server = start_server(tmp_path, port)
    try:
        synced = runner_cli(*hints[0].split()[1:])  # the hint, as printed
        assert synced.returncode == 0, synced.stdout + synced.stderr[-3000:]
        _, parents, children = clients(uri, "tensor-runner")
        assert [p.info.status for p in parents] == ["FINISHED"], synced.stdout
        assert sorted(c.info.status for c in children) == ["FINISHED"] * 2
        assert {c.data.tags["mlflow.parentRunId"] for c in children} == {parents[0].info.run_id}
    finally:
        stop_server(server)

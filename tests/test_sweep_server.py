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

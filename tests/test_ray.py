"""The Ray launcher against a real local Ray cluster (`ray start --head` on loopback, stopped afterwards).

Needs `pip install -e '.[ray]'` (hydra-ray-launcher, ray); skipped without it.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import pytest
from helpers import free_port, mlflow_runs, results, sweep_cli

from runner.config import PROJECT_ROOT

PLUGIN = PROJECT_ROOT / "tests" / "plugin"  # crash_model.py: a job whose process dies

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("hydra_plugins.hydra_ray_launcher") is None, reason="pip install -e '.[ray]'"
)


@pytest.fixture
def ray_head():
    """The address of a one-node Ray cluster started here, in its own session so that all of it stops."""
    port = free_port()
    temp_dir = tempfile.mkdtemp(prefix="ray-", dir="/tmp")  # short: Ray's unix socket paths must fit 107 bytes
    paths = [str(PROJECT_ROOT / "src"), str(PLUGIN), os.environ.get("PYTHONPATH", "")]  # the workers' imports
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}
    head = subprocess.Popen(
        [sys.executable, "-m", "ray.scripts.scripts", "start", "--head", "--block"]
        + [f"--port={port}", "--node-ip-address=127.0.0.1", "--num-cpus=2", "--include-dashboard=false"]
        + ["--disable-usage-stats"]
        + [f"--temp-dir={temp_dir}"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        _wait_for_head(head)
        yield f"127.0.0.1:{port}"
    finally:
        if head.poll() is None:
            os.killpg(head.pid, signal.SIGTERM)  # --block: the head stops every Ray process it started
            head.wait(timeout=120)
        shutil.rmtree(temp_dir, ignore_errors=True)


def _wait_for_head(head: subprocess.Popen, timeout_s: float = 180) -> None:
    deadline = time.monotonic() + timeout_s
    for line in head.stdout:
        if "Ray runtime started" in line:
            return
        if time.monotonic() > deadline:
            break
    raise AssertionError(f"ray start --head did not start (exit {head.poll()})")


def test_cuda_jobs_ask_ray_for_gpus_and_cpu_jobs_do_not():
    from omegaconf import OmegaConf

    from runner.launch.ray_launch import remote_options

    remote = OmegaConf.create({"num_cpus": 4})
    assert remote_options(remote, "cuda", 1, cluster_gpus=8) == {"num_cpus": 4, "num_gpus": 1}
    assert remote_options(remote, "cpu", 1, cluster_gpus=8) == {"num_cpus": 4}
    assert remote_options(remote, "cuda", 0.5, cluster_gpus=8) == {"num_cpus": 4, "num_gpus": 0.5}
    assert remote_options(remote, "auto", 1, cluster_gpus=8) == {"num_cpus": 4}  # as on SLURM: only cuda asks
    assert remote_options(OmegaConf.create({"num_gpus": 2}), "cuda", 1, 8) == {"num_gpus": 2}  # explicit wins
    with pytest.raises(SystemExit):
        remote_options(remote, "cuda", 1, cluster_gpus=0)


@pytest.mark.slow  # a Ray head takes 15-30 s to start
def test_four_jobs_on_ray_are_one_parent_and_four_finished_children(ray_head, tmp_path):
    result = sweep_cli(
        tmp_path,
        "hydra/launcher=ray_cluster",
        f"hydra.launcher.ray.init.address={ray_head}",
        "hydra.launcher.ray.remote.num_cpus=1",
        "backend=numpy,torch",
        "seed=1,2",
        timeout=600,
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    saved = results(tmp_path)
    assert [r["status"] for r in saved.values()] == ["FINISHED"] * 4
    ray_jobs = {r["environment"]["ray_job_id"] for r in saved.values()}
    assert len(ray_jobs) == 1 and ray_jobs.pop().strip("f")  # one Ray job (the sweep), not the nil id
    parents, children = mlflow_runs(tmp_path)
    assert len(parents) == 1 and parents[0].info.status == "FINISHED"
    assert [c.info.status for c in children] == ["FINISHED"] * 4
    assert {c.data.tags["mlflow.parentRunId"] for c in children} == {parents[0].info.run_id}
    assert {c.data.tags["env.ray_job_id"] for c in children} == {saved["0"]["environment"]["ray_job_id"]}


@pytest.mark.slow
def test_a_job_whose_ray_task_dies_is_failed_and_the_others_land(ray_head, tmp_path):
    result = sweep_cli(
        tmp_path,
        "hydra/launcher=ray_cluster",
        f"hydra.launcher.ray.init.address={ray_head}",
        "hydra.launcher.ray.remote.num_cpus=1",
        f"hydra.searchpath=[file://{PLUGIN / 'conf'}]",
        "isolation=inline",  # the job runs in the Ray task's own process, which the crash model kills
        "backend=numpy",
        "model=sigmoid,crash,sigmoid",
        "task=inference",
        timeout=600,
    )
    assert result.returncode == 1, result.stdout[-2000:] + result.stderr[-3000:]  # a job failed
    saved = results(tmp_path)
    assert [r["status"] for r in saved.values()] == ["FINISHED", "FAILED", "FINISHED"]
    assert saved["1"]["error"].startswith("Ray task ended without a result")
    parents, children = mlflow_runs(tmp_path)
    assert len(parents) == 1 and parents[0].info.status == "FAILED"
    assert sorted(c.info.status for c in children) == ["FAILED", "FINISHED", "FINISHED"]
    assert {c.data.tags["mlflow.parentRunId"] for c in children} == {parents[0].info.run_id}

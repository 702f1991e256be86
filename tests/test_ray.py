"""The Ray launcher against a real local Ray cluster (`ray start --head` on loopback, stopped afterwards).

Needs `pip install -e '.[ray]'` (hydra-ray-launcher, ray); skipped without it.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter

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
def test_a_job_whose_ray_task_dies_is_failed_and_the_others_land(ray_head, tmp_path, monkeypatch):
    # the crash model is imported where the sweep is launched too: preflight checks every job's model there
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(PLUGIN), os.environ.get("PYTHONPATH", "")]))
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


NODES = ("node-1", "node-2", "node-3")


def _on_host(host: str, *command: str) -> list[str]:
    """The command in a UTS namespace of its own, named `host`: a Ray node whose tasks see that host name."""
    return ["unshare", "--uts", "sh", "-c", f'hostname {host} && exec "$0" "$@"', *command]


@pytest.fixture(scope="module")
def ray_nodes():
    """A Ray cluster of three nodes on this machine (a head and two workers, each `ray start` in a host name of its
    own and on ports of its own, all in one temp folder, so one logs folder: each node's log monitor reads every
    worker's output), started once for this module's tests; its address. Needs root for unshare."""
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("three Ray nodes with their own host names need unshare --uts (root)")
    port = free_port()
    temp_dir = tempfile.mkdtemp(prefix="ray-", dir="/tmp")
    paths = [str(PROJECT_ROOT / "src"), str(PLUGIN), os.environ.get("PYTHONPATH", "")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}
    ray = [sys.executable, "-m", "ray.scripts.scripts", "start", "--block", "--node-ip-address=127.0.0.1"]
    ray += ["--num-cpus=2", "--disable-usage-stats"]
    head = [*ray, "--head", f"--port={port}", "--include-dashboard=false", f"--temp-dir={temp_dir}"]
    started = [_start(_on_host(NODES[0], *head), env)]
    try:
        _wait_for_head(started[0])
        for k, node in enumerate(NODES[1:], 1):  # the ports a raylet takes by default would collide on one machine
            base = 30000 + 1000 * k  # a range of ports per node, its workers' above its own six
            names = ("node-manager", "object-manager", "metrics-export", "dashboard-agent-listen")
            names += ("dashboard-agent-grpc", "runtime-env-agent")
            ports = [f"--{name}-port={base + i}" for i, name in enumerate(names)]
            ports += [f"--min-worker-port={base + 100}", f"--max-worker-port={base + 999}"]
            started.append(_start(_on_host(node, *ray, f"--address=127.0.0.1:{port}", *ports), env))
            _wait_for_nodes(f"127.0.0.1:{port}", env, k + 1, started)  # one at a time: 2 cores, a busy GCS
        yield f"127.0.0.1:{port}"
    finally:
        for process in reversed(started):
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGTERM)
                process.wait(timeout=120)
        shutil.rmtree(temp_dir, ignore_errors=True)


def _start(command: list[str], env: dict) -> subprocess.Popen:
    return subprocess.Popen(
        command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )


def _wait_for_nodes(address: str, env: dict, count: int, started: list, timeout_s: float = 120) -> None:
    code = f"import ray; ray.init(address='{address}', logging_level='ERROR')\n"
    code += "print(len([n for n in ray.nodes() if n['Alive']]))"
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
        if done.stdout.strip().splitlines()[-1:] == [str(count)]:
            return
        time.sleep(2)
    said = [process.stdout.read() if process.poll() is not None else "(running)" for process in started]
    raise AssertionError(f"the Ray cluster at {address} did not reach {count} nodes: {said}")


@pytest.mark.slow
def test_a_sweep_blocked_by_node_on_three_ray_nodes_ranks_its_configurations(ray_nodes, tmp_path):
    """hydra.launcher.blocks=3 on Ray: each node (a bundle of a STRICT_SPREAD placement group) runs both
    configurations in interleaved rounds; the answer pools the three nodes as replicates."""
    from runner import report
    from runner.record import runs
    from runner.report import pooled

    result = sweep_cli(
        tmp_path,
        "hydra/launcher=ray_cluster",
        f"hydra.launcher.ray.init.address={ray_nodes}",
        "hydra.launcher.ray.remote.num_cpus=1",
        "hydra.launcher.blocks=3",
        "model=matmul",
        "task=inference",
        "model.n=128",
        "backend=numpy,torch",
        "threads=1",
        "timing.max_time_s=1",
        timeout=900,
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    assert said_lines(result.stderr) == {number: 1 for number in range(6)}, result.stderr[-3000:]
    found = runs.from_dirs(runs.runs_in(tmp_path / "sweep"))
    assert [run.status for run in found] == ["FINISHED"] * 6
    by_node = {node: sorted(r.params["backend.name"] for r in found if r.identity.host == node) for node in NODES}
    assert by_node == {node: ["numpy", "torch"] for node in NODES}
    (torch,) = [p for p in pooled.pool(report.frame(found)) if not p.is_fastest]
    assert torch.runs == 3 and torch.low < torch.ratio < torch.high
    assert torch.comparison.basis is not None and " on 3 nodes" in torch.comparison.basis
    refused = sweep_cli(
        tmp_path / "more",
        "hydra/launcher=ray_cluster",
        f"hydra.launcher.ray.init.address={ray_nodes}",
        "hydra.launcher.blocks=4",
        "backend=numpy,torch",
    )
    assert refused.returncode == 1
    assert "error: hydra.launcher.blocks=4 asks for 4 nodes, but the Ray cluster has 3" in refused.stderr


def said_lines(stderr: str) -> Counter:
    """How many times each job's line ('numpy · matmul-inference-eager-cpu-float32 #3: FINISHED, median ...') is on
    a sweep's terminal, by job number, each opening on its place among the sweep's jobs ('[4/6] ...'), as on one
    machine."""
    return Counter(int(number) for number in re.findall(r"^\[\d+/\d+\] .* #(\d+): (?:FINISHED|FAILED)", stderr, re.M))


@pytest.mark.slow
def test_each_jobs_line_of_a_sweep_on_three_ray_nodes_is_said_once(ray_nodes, tmp_path):
    """Forwarded by Ray, a task's output came once per node reading the logs folder: each job's line three times on
    three nodes of one machine (and Ray's deduplication hid lines of jobs that differ only in numbers, seed=1 and
    seed=3). The launching process says each job's line itself, as its task ends."""
    result = sweep_cli(
        tmp_path,
        "hydra/launcher=ray_cluster",
        f"hydra.launcher.ray.init.address={ray_nodes}",
        "hydra.launcher.ray.remote.num_cpus=1",
        "model=matmul",
        "task=inference",
        "model.n=64",
        "backend=numpy,torch",
        "seed=1,2,3",
        timeout=600,
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    assert said_lines(result.stderr) == {number: 1 for number in range(6)}, result.stderr[-3000:]
    assert "(run_job_as_launched pid=" not in result.stderr  # nothing of the tasks' own output forwarded


@pytest.mark.slow
def test_a_block_run_by_a_ray_worker_without_the_sweeps_job_id_records_it(ray_head, tmp_path):
    """A Ray worker started before the sweep's Ray job (as on the node a sweep is launched from, where Ray starts
    workers when a driver connects) has no job id or the nil one in its RAY_JOB_ID, which a block's measuring workers
    inherited: the head node's runs recorded no ray_job_id. Here every worker of the sweep has the nil id."""
    result = sweep_cli(
        tmp_path,
        "hydra/launcher=ray_cluster",
        f"hydra.launcher.ray.init.address={ray_head}",
        "hydra.launcher.ray.remote.num_cpus=1",
        "hydra.launcher.blocks=1",
        "+hydra.launcher.ray.init.runtime_env.env_vars.RAY_JOB_ID=ffffffff",
        "model=matmul",
        "task=inference",
        "model.n=64",
        "backend=numpy,torch",
        timeout=600,
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    ray_jobs = [r["environment"].get("ray_job_id") for r in results(tmp_path).values()]
    assert len(ray_jobs) == 2 and len(set(ray_jobs)) == 1, ray_jobs
    assert isinstance(ray_jobs[0], str) and ray_jobs[0].strip("f"), ray_jobs  # the sweep's, not none nor the nil id
    assert said_lines(result.stderr) == {0: 1, 1: 1}, result.stderr[-3000:]


def test_a_task_asking_for_more_than_any_node_has_is_refused_in_one_line_naming_both():
    from runner.launch.ray_launch import asked_of, resources_refusal

    nodes = [{"Alive": True, "Resources": {"CPU": 2.0, "memory": 1e9}}] * 3
    assert resources_refusal(asked_of({"num_cpus": 2}), nodes, "job") is None
    assert resources_refusal(asked_of({"num_cpus": 4}), nodes, "job") == (
        "hydra.launcher asks Ray for 4 CPUs per job, which a node must hold, but 0 of the Ray cluster's 3 nodes can "
        "(each has 2 CPUs, ray.nodes()): lower hydra.launcher.ray.remote.num_cpus (num_gpus, gpus_per_cuda_job)"
    )
    mixed = [{"Resources": {"CPU": 8.0}}, {"Resources": {"CPU": 2.0}}]
    assert resources_refusal({"CPU": 4, "GPU": 0}, mixed, "block", 1) is None
    refused = resources_refusal({"CPU": 4, "GPU": 0}, mixed, "block", 2)
    assert refused is not None and "which 2 nodes must hold, but 1 of the Ray cluster's 2 nodes can" in refused
    assert "(each has 2 CPUs or 8 CPUs, ray.nodes())" in refused


def test_a_ray_option_blocks_do_not_apply_is_refused_in_one_line_not_dropped():
    """A block's task asked Ray for CPUs and GPUs only, and a `memory` or `runtime_env` under hydra.launcher.ray.remote
    was dropped without a word."""
    from runner.launch.ray_launch import unused_by_blocks

    assert unused_by_blocks({"num_cpus": 4, "max_retries": 0, "num_gpus": 1}) is None  # the shipped ones
    assert unused_by_blocks({"num_cpus": 4, "runtime_env": {}, "memory": 1e9}) == (
        "hydra.launcher.ray.remote.memory, hydra.launcher.ray.remote.runtime_env are not applied to blocks "
        "(hydra.launcher.blocks): a block's Ray task asks for num_cpus and num_gpus only; give the workers' "
        "environment with hydra.launcher.ray.init.runtime_env, or launch a task per job (no blocks)"
    )


def test_a_placement_group_not_placed_in_its_time_is_removed_and_the_sweep_refused_saying_what_is_free(monkeypatch):
    import ray

    from runner.launch import launchers, ray_launch

    groups = importlib.import_module("ray.util.placement_group")  # the module: ray.util's name is its function

    waited, removed = [], []

    class Unplaced:
        def wait(self, timeout_seconds: float) -> bool:
            waited.append(timeout_seconds)
            return False

    monkeypatch.setattr(groups, "placement_group", lambda bundles, strategy: Unplaced())
    monkeypatch.setattr(groups, "remove_placement_group", removed.append)
    monkeypatch.setattr(ray, "available_resources", lambda: {"CPU": 1.0, "memory": 1e9})
    with pytest.raises(launchers.SweepRefused) as refused:
        ray_launch.placed_group({"CPU": 2.0, "GPU": 0.0}, 3)
    assert waited == [ray_launch.PLACEMENT_WAIT_S] and len(removed) == 1
    assert refused.value.line == (
        "Ray did not place 3 blocks of 2 CPUs each on 3 nodes (a STRICT_SPREAD placement group) within 60 s: the "
        "cluster has 1 CPU free in all (ray.available_resources())"
    )


def test_a_ray_task_runs_with_the_thread_variables_the_sweep_was_launched_with(monkeypatch):
    from runner.launch.ray_launch import run_job_as_launched, thread_variables

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setenv("MKL_NUM_THREADS", "3")
    launched = thread_variables()
    monkeypatch.setenv("OMP_NUM_THREADS", "2")  # as Ray sets it in a task of num_cpus=2
    monkeypatch.delenv("MKL_NUM_THREADS")
    seen = run_job_as_launched(
        launched, lambda a: (a, os.environ.get("OMP_NUM_THREADS"), os.environ["MKL_NUM_THREADS"]), 7
    )
    assert seen == (7, None, "3")


@pytest.mark.slow
def test_num_cpus_above_the_nodes_cpus_is_refused_at_once_and_a_ray_run_is_the_machine_a_local_run_is(
    ray_head, tmp_path
):
    """The shipped num_cpus: 4 on a 2-CPU node waited for ever: refused in one line before anything is submitted, its
    parent run FAILED. A job run on Ray (num_cpus=2: Ray would set OMP_NUM_THREADS=2) and the same job run here
    without Ray have one machine key."""
    from helpers import run_cli

    from runner.record import runs

    on_ray = ["hydra/launcher=ray_cluster", f"hydra.launcher.ray.init.address={ray_head}"]
    job = ["model=matmul", "task=inference", "model.n=64", "backend=numpy"]
    started = time.monotonic()
    refused = sweep_cli(tmp_path / "four", *on_ray, "hydra.launcher.ray.remote.num_cpus=4", *job, "seed=1,2")
    assert time.monotonic() - started < 120 and refused.returncode == 1, refused.stderr[-3000:]
    assert [line for line in refused.stderr.splitlines() if line.startswith("error:")] == [
        "error: hydra.launcher asks Ray for 4 CPUs per job, which a node must hold, but 0 of the Ray cluster's 1 nodes "
        "can (each has 2 CPUs, ray.nodes()): lower hydra.launcher.ray.remote.num_cpus (num_gpus, gpus_per_cuda_job)"
    ]
    (parent,) = mlflow_runs(tmp_path / "four")[0]
    assert parent.info.status == "FAILED" and not list((tmp_path / "four" / "sweep").glob("*/result.json"))
    ray_run = sweep_cli(tmp_path / "ray", *on_ray, "hydra.launcher.ray.remote.num_cpus=2", *job, timeout=600)
    assert ray_run.returncode == 0, ray_run.stdout[-2000:] + ray_run.stderr[-3000:]
    local = run_cli(*job, "tracking=none", f"hydra.run.dir={tmp_path / 'local'}", "timing.max_time_s=0.2")
    assert local.returncode == 0, local.stderr[-3000:]
    (on_ray_run,) = runs.from_dirs(runs.runs_in(tmp_path / "ray" / "sweep"))
    (here,) = runs.from_dirs([tmp_path / "local"])
    assert on_ray_run.identity.host == here.identity.host
    assert on_ray_run.identity.machine.key == here.identity.machine.key, (on_ray_run.identity, here.identity)


@pytest.mark.slow
def test_sigterm_to_a_ray_sweep_closes_its_parent_killed_not_running(ray_head, tmp_path):
    from helpers import made_store

    command = [sys.executable, str(PROJECT_ROOT / "run.py"), "-m", f"tracking.uri={made_store(tmp_path)}"]
    command += ["tracking.experiment=sweeps", f"hydra.sweep.dir={tmp_path}/sweep", "hydra/launcher=ray_cluster"]
    command += [f"hydra.launcher.ray.init.address={ray_head}", "hydra.launcher.ray.remote.num_cpus=1"]
    command += ["model=matmul", "task=inference", "backend=numpy,torch", "timing.max_time_s=60"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(PROJECT_ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    sweep = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 300
        while not list((tmp_path / "sweep").glob("*/job.log")) and time.monotonic() < deadline:
            time.sleep(1)
        assert sweep.poll() is None, sweep.stdout.read() if sweep.stdout else ""
        sweep.send_signal(signal.SIGTERM)
        out, _ = sweep.communicate(timeout=180)
    finally:
        if sweep.poll() is None:
            sweep.kill()
    assert sweep.returncode != 0, out[-3000:]
    parents, _ = mlflow_runs(tmp_path)
    assert [p.info.status for p in parents] == ["KILLED"], out[-3000:]

"""A local SLURM of three nodes on one machine (scripts/local-slurm.sh up --nodes 3): each node is a host of its own.

`pytest -m slurm tests/test_local_cluster.py` brings the three nodes up (as root) unless partition `debug` holds
node-1 .. node-3 already, and takes them down afterwards. This machine runs one SLURM at a time, and
tests/test_slurm.py's is one node: with both files selected, run them in one process (-n0), where this
module's cluster is down again before test_slurm.py's comes up.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_slurm import SCRIPT, _debug_partition_answers

from runner.config import PROJECT_ROOT

NODES = ["node-1", "node-2", "node-3"]


def _debug_nodes() -> list[str]:
    if shutil.which("sinfo") is None:
        return []
    out = subprocess.run(["sinfo", "-h", "-N", "-p", "debug", "-o", "%N"], capture_output=True, text=True, timeout=30)
    return sorted(out.stdout.split()) if out.returncode == 0 else []


def _another_slurm_module_runs_at_once(session: pytest.Session) -> bool:
    """Under pytest-xdist's --dist loadfile another worker takes the other modules' SLURM tests, at the same time."""
    if int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")) < 2:
        return False
    here = Path(__file__).name
    return any(item.get_closest_marker("slurm") and item.path.name != here for item in session.items)


@pytest.fixture(scope="module")
def three_nodes(request):
    """Partition `debug` of node-1 .. node-3: the one running, or scripts/local-slurm.sh up --nodes 3's."""
    if _debug_nodes() == NODES:
        yield
        return
    if _another_slurm_module_runs_at_once(request.session):
        pytest.skip("the other SLURM tests start a one-node cluster at the same time: run with -n0")
    if _debug_partition_answers():
        pytest.skip(f"partition `debug` answers with nodes {_debug_nodes()}, not {NODES}: take it down first")
    if os.geteuid() != 0:
        pytest.skip("no SLURM partition `debug` answers, and starting one (scripts/local-slurm.sh up) needs root")
    up = subprocess.run([str(SCRIPT), "up", "--nodes", "3"], capture_output=True, text=True, timeout=900)
    if up.returncode != 0:
        pytest.skip(f"scripts/local-slurm.sh up --nodes 3 failed: {(up.stderr or up.stdout).strip().splitlines()[-1:]}")
    try:
        yield
    finally:
        subprocess.run([str(SCRIPT), "down"], capture_output=True, timeout=300)


@pytest.mark.slurm
def test_a_job_on_each_node_sees_that_nodes_name_as_its_host_name(three_nodes, tmp_path):
    job = f"{shlex.quote(sys.executable)} -c 'import platform; print(platform.node())'; echo \"$SLURMD_NODENAME\""
    submitted = {
        node: subprocess.Popen(
            ["sbatch", "--wait", "--exclusive", "--partition=debug", f"--nodelist={node}", "--time=5"]
            + [f"--output={tmp_path / node}.out", "--wrap", job],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for node in NODES
    }
    for node, sbatch in submitted.items():  # --exclusive on different nodes: the three run at once
        out, _ = sbatch.communicate(timeout=300)
        assert sbatch.returncode == 0, f"{node}: {out}"
    seen = {node: (tmp_path / f"{node}.out").read_text().split() for node in NODES}
    assert seen == {node: [node, node] for node in NODES}  # platform.node(), then $SLURMD_NODENAME


@pytest.mark.slurm
def test_a_sweep_blocked_by_node_ranks_three_configurations_over_three_nodes(three_nodes, tmp_path):
    """hydra.launcher.blocks=3: each node runs the three configurations in interleaved rounds; the answer pools the
    nodes as replicates, each configuration against the fastest with an interval over the three nodes."""
    from helpers import sweep_cli

    from runner import report
    from runner.record import runs
    from runner.report import pooled

    overrides = ["hydra/launcher=slurm", "hydra.launcher.partition=debug", "hydra.launcher.blocks=3"]
    overrides += ["model=matmul", "task=inference", "model.n=128", "backend=numpy,torch,tnp", "threads=1"]
    result = sweep_cli(tmp_path, *overrides, "timing.max_time_s=1", timeout=900)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    found = runs.from_dirs(runs.runs_in(tmp_path / "sweep"))
    assert [run.status for run in found] == ["FINISHED"] * 9
    by_node = {node: sorted(r.params["backend.name"] for r in found if r.identity.host == node) for node in NODES}
    assert by_node == {node: ["numpy", "tnp", "torch"] for node in NODES}
    assert len({r.identity.machine.key for r in found}) == 1  # three hosts, one kind of machine
    answer = pooled.pool(report.frame(found))
    assert sorted(p.label for p in answer) == ["numpy", "tnp", "torch"] and {p.runs for p in answer} == {3}
    for compared in (p for p in answer if not p.is_fastest):
        assert compared.low < compared.ratio < compared.high, compared
        assert compared.comparison.basis is not None and " on 3 nodes" in compared.comparison.basis
    assert "slurm: submitting 3 blocks of 3 jobs" in result.stdout


def _restart_three_nodes() -> None:
    """The three nodes as up --nodes 3 leaves them, after a test took one down or killed it."""
    subprocess.run([str(SCRIPT), "down"], capture_output=True, timeout=300)
    up = subprocess.run([str(SCRIPT), "up", "--nodes", "3"], capture_output=True, text=True, timeout=900)
    assert up.returncode == 0, up.stderr


@pytest.mark.slurm
def test_a_node_down_before_the_sweep_refuses_three_blocks_in_one_line_before_anything_is_submitted(
    three_nodes, tmp_path
):
    from helpers import sweep_cli

    from runner.launch import slurm_fit

    down = ["scontrol", "update", "nodename=node-2", "state=down", "reason=taken down by hand"]
    subprocess.run(down, check=True, capture_output=True, timeout=60)
    try:
        before = subprocess.run(["squeue", "-h", "-o", "%i"], capture_output=True, text=True, timeout=60).stdout
        refused = sweep_cli(
            tmp_path, *ON_THREE, "hydra.launcher.blocks=3", "model=matmul", "task=inference", "backend=numpy,torch"
        )
        after = subprocess.run(["squeue", "-h", "-o", "%i"], capture_output=True, text=True, timeout=60).stdout
        two = slurm_fit.blocks_on_partition(2, "debug")  # two nodes are up: two blocks pass
    finally:
        subprocess.run(["scontrol", "update", "nodename=node-2", "state=resume"], capture_output=True, timeout=60)
    assert refused.returncode == 2, refused.stdout[-2000:] + refused.stderr[-3000:]
    assert refused.stderr.splitlines() == [
        "error: hydra.launcher.blocks=3 asks for 3 nodes, but partition debug has 2 up of 3 "
        "(node-2 down (taken down by hand)) (sinfo)"
    ]
    assert after == before and not (tmp_path / "sweep").exists()  # nothing submitted, nothing written
    assert two is None


ON_THREE = ["hydra/launcher=slurm", "hydra.launcher.partition=debug"]
LOSS_NAMED_WITHIN_S = 120  # the bound: SlurmdTimeout=30 s on the local cluster, the launcher's poll within 15 s


@pytest.mark.slurm
def test_a_node_lost_mid_sweep_is_named_and_the_answer_rests_on_the_other_two(three_nodes, tmp_path):
    """A node dies mid-sweep (scripts/local-slurm.sh kill: its slurmd and its jobs): its block is ended NODE_FAIL with
    a line naming the node within two minutes, its jobs FAILED with that line; the other blocks' runs are kept
    FINISHED and pooled on the two nodes left, which a line names; nothing is left RUNNING in MLflow."""
    from helpers import made_store, mlflow_runs, results

    from runner import report
    from runner.record import runs
    from runner.report import pooled

    overrides = [*ON_THREE, "hydra.launcher.blocks=3", "model=matmul", "task=inference", "model.n=128"]
    overrides += ["backend=numpy,torch", "threads=1", "timing.max_time_s=20"]
    command = [sys.executable, str(PROJECT_ROOT / "run.py"), "-m", f"tracking.uri={made_store(tmp_path)}"]
    command += ["tracking.experiment=sweeps", f"hydra.sweep.dir={tmp_path}/sweep", *overrides]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(PROJECT_ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    sweep = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: list[tuple[float, str]] = []
    try:
        killed_at, node = _kill_block_two_node(sweep, lines, tmp_path / "sweep")
        lines += [(time.monotonic(), line) for line in sweep.stdout]
        sweep.wait(timeout=600)
    finally:
        if sweep.poll() is None:
            sweep.kill()
        _restart_three_nodes()
    said = "".join(line for _, line in lines)
    named = [(at, line) for at, line in lines if line.startswith("slurm: block 2 ") and "NODE_FAIL" in line]
    assert named, said[-3000:]
    assert f" on {node}" in named[0][1] and named[0][0] - killed_at < LOSS_NAMED_WITHIN_S, named
    assert sweep.returncode == 1, said[-3000:]  # a job failed
    others = sorted(set(NODES) - {node})
    assert f"slurm: the answer rests on 2 of 3 nodes: {', '.join(others)} (block 2 on {node}: NODE_FAIL)" in said
    saved = results(tmp_path)
    assert [saved[n]["status"] for n in "012345"] == [
        "FINISHED",
        "FINISHED",
        "FAILED",
        "FAILED",
        "FINISHED",
        "FINISHED",
    ]
    assert all("NODE_FAIL" in saved[n]["error"] and f" on {node}" in saved[n]["error"] for n in "23")
    parents, children = mlflow_runs(tmp_path)
    assert [p.info.status for p in parents] == ["FAILED"]
    assert sorted(c.info.status for c in children) == ["FAILED"] * 2 + ["FINISHED"] * 4
    found = [run for run in runs.from_dirs(runs.runs_in(tmp_path / "sweep")) if run.status == "FINISHED"]
    assert sorted(run.identity.host for run in found) == sorted(others * 2)
    answer = pooled.pool(report.frame(found))
    assert {(p.runs, p.nodes) for p in answer} == {(2, 2)}  # '2 on 2 nodes'


def _kill_block_two_node(sweep: subprocess.Popen, lines: list, sweep_dir: Path) -> tuple[float, str]:
    """Reads the sweep's lines until block 2 runs and its first job has started, then kills that node: (when, node)."""
    assert sweep.stdout is not None
    for line in sweep.stdout:
        lines.append((time.monotonic(), line))
        if line.startswith("slurm: block 2 ") and " RUNNING on " in line:
            node = line.split(" RUNNING on ")[1].split()[0]
            break
    else:
        raise AssertionError("".join(line for _, line in lines)[-3000:])
    deadline = time.monotonic() + 120
    while not (sweep_dir / "2" / "job.log").exists() and time.monotonic() < deadline:
        time.sleep(1)
    time.sleep(5)  # its rounds under way
    killed = subprocess.run([str(SCRIPT), "kill", node], capture_output=True, text=True, timeout=60)
    assert killed.returncode == 0, killed.stderr
    return time.monotonic(), node

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
from pathlib import Path

import pytest
from test_slurm import SCRIPT, _debug_partition_answers

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

"""Scale-out launchers under conf/hydra/launcher/: they compose, and submitit runs a tracked sweep."""

from __future__ import annotations

import importlib.util

import pytest
from helpers import mlflow_runs, results, sweep_cli

from runner.config import compose


def launcher(name: str, *overrides: str):
    return compose([f"hydra/launcher={name}", *overrides], return_hydra_config=True).hydra.launcher


def test_slurm_launcher_composes_with_cluster_settings():
    conf = launcher("slurm", "hydra.launcher.partition=gpu", "hydra.launcher.gpus_per_node=1")
    assert conf._target_ == "hydra_plugins.tensor_runner.slurm_launcher.SlurmLauncher"  # runner.slurm's
    assert conf.partition == "gpu" and conf.gpus_per_node == 1
    assert conf.cpus_per_task is None and conf.mem_gb is None  # taken from the partition at launch


def test_parallel_launcher_is_joblib():
    conf = launcher("parallel", "hydra.launcher.n_jobs=3")
    assert conf._target_.endswith("joblib_launcher.JoblibLauncher") and conf.n_jobs == 3


@pytest.mark.skipif(
    importlib.util.find_spec("hydra_plugins.hydra_ray_launcher") is None, reason="pip install -e '.[ray]'"
)
def test_ray_launcher_composes():
    conf = launcher("ray_cluster")
    assert conf._target_.endswith("ray_launcher.RayLauncher") and conf.ray.init.address == "auto"


def test_submitit_local_sweep_is_one_parent_with_children(tmp_path):
    """submitit's local executor runs each job in its own process, as SLURM would on a node."""
    result = sweep_cli(tmp_path, "hydra/launcher=submitit_local", "backend=numpy", "seed=0,1")
    assert result.returncode == 0, result.stderr[-3000:]
    assert [r["status"] for r in results(tmp_path).values()] == ["FINISHED", "FINISHED"]
    parents, children = mlflow_runs(tmp_path)
    assert len(parents) == 1 and parents[0].info.status == "FINISHED"
    assert {c.data.tags["mlflow.parentRunId"] for c in children} == {parents[0].info.run_id}
    assert len(children) == 2

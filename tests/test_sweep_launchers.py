"""Scale-out launchers under conf/hydra/launcher/: they compose, and submitit runs a tracked sweep."""

from __future__ import annotations

import importlib.util
import logging

import pytest
from helpers import mlflow_runs, results, sweep_cli

from runner.config import compose


def launcher(name: str, *overrides: str):
    return compose([f"hydra/launcher={name}", *overrides], return_hydra_config=True).hydra.launcher


def test_slurm_launcher_composes_with_cluster_settings():
    conf = launcher("slurm", "hydra.launcher.partition=gpu", "hydra.launcher.gpus_per_node=1")
    assert conf._target_ == "hydra_plugins.tensor_runner.slurm_launcher.SlurmLauncher"  # runner.launch.slurm's
    assert conf.partition == "gpu" and conf.gpus_per_node == 1
    assert conf.cpus_per_task is None and conf.mem_gb is None  # taken from the partition at launch


def test_parallel_launcher_is_joblib():
    conf = launcher("parallel", "hydra.launcher.n_jobs=3")
    assert conf._target_.endswith("parallel_launcher.ParallelLauncher") and conf.n_jobs == 3


@pytest.mark.skipif(
    importlib.util.find_spec("hydra_plugins.hydra_ray_launcher") is None, reason="pip install -e '.[ray]'"
)
def test_ray_launcher_composes():
    conf = launcher("ray_cluster")
    assert conf._target_.endswith("ray_launcher.RayLauncher") and conf.ray.init.address == "auto"


@pytest.mark.heavy  # a Hydra plugin launcher's sweep: test_sweep.py's joblib sweep in the default set
def test_submitit_local_sweep_is_one_parent_with_children(tmp_path):
    """submitit's local executor runs each job in its own process, as SLURM would on a node."""
    result = sweep_cli(tmp_path, "hydra/launcher=submitit_local", "backend=numpy", "seed=0,1")
    assert result.returncode == 0, result.stderr[-3000:]
    assert [r["status"] for r in results(tmp_path).values()] == ["FINISHED", "FINISHED"]
    parents, children = mlflow_runs(tmp_path)
    assert len(parents) == 1 and parents[0].info.status == "FINISHED"
    assert {c.data.tags["mlflow.parentRunId"] for c in children} == {parents[0].info.run_id}
    assert len(children) == 2


def test_mlflow_variables_choose_the_store_and_explicit_settings_win(monkeypatch, tmp_path):
    """A shell pointed at the team's server (MLflow's own variables) logs there, not to outputs/mlflow.db."""
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://mlflow.team:5000")
    monkeypatch.setenv("MLFLOW_EXPERIMENT_NAME", "resnets")
    cfg = compose([])
    assert (cfg.tracking.uri, cfg.tracking.experiment) == ("http://mlflow.team:5000", "resnets")
    cfg = compose([f"tracking.uri=sqlite:///{tmp_path}/mine.db", "tracking.experiment=mine"])
    assert (cfg.tracking.uri, cfg.tracking.experiment) == (f"sqlite:///{tmp_path}/mine.db", "mine")
    monkeypatch.delenv("MLFLOW_TRACKING_URI")
    assert compose([]).tracking.uri.endswith("/outputs/mlflow.db")


def test_a_cluster_sweep_with_a_store_on_this_machine_is_warned_about(tmp_path, caplog):
    from runner.launch.launchers import cluster_launcher
    from runner.launch.sweep import lifecycle

    assert cluster_launcher(launcher("slurm")) and not cluster_launcher(launcher("parallel"))
    overrides = ["hydra/launcher=slurm", "tracking=none", f"hydra.sweep.dir={tmp_path}"]
    config = compose(overrides, return_hydra_config=True)
    with caplog.at_level(logging.WARNING, logger="runner.launch.sweep.lifecycle"):
        lifecycle.start(config)
        assert not caplog.records  # nothing tracked: nothing to share
        config.tracking.name, config.tracking.uri = "mlflow", "sqlite:////unreachable/dir/mlflow.db"
        lifecycle.start(config)
    warnings = [r.getMessage() for r in caplog.records if "every node of the cluster" in r.getMessage()]
    assert len(warnings) == 1 and "MLFLOW_TRACKING_URI" in warnings[0]


def test_a_cluster_sweep_over_this_hosts_devices_is_refused_in_one_line(tmp_path):
    """cpu_vs_gpu_matmul sweeps device over ${runner.devices:}: on a GPU-less login node the cuda jobs would
    silently vanish from a SLURM sweep, so it is refused before anything is created or submitted."""
    from helpers import run_cli

    result = run_cli("+experiment=cpu_vs_gpu_matmul", "hydra/launcher=slurm", f"hydra.sweep.dir={tmp_path}/sweep")
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [
        "error: device: ${runner.devices:} lists the devices of this host, not of the nodes the jobs run on: "
        "name them instead (device=cpu,cuda)"
    ]
    assert not (tmp_path / "sweep").exists()


def test_a_cluster_launcher_without_its_extra_is_one_line(tmp_path, monkeypatch):
    from runner.launch import preflight, where_it_runs

    monkeypatch.setitem(where_it_runs.LAUNCHER_EXTRAS, "ray_cluster", ("no_such_plugin_module", "ray"))
    with pytest.raises(preflight.BadInput, match=r"^hydra/launcher=ray_cluster needs the ray extra: pip install"):
        preflight.check_argv(["-m", "hydra/launcher=ray_cluster", "backend=numpy"])

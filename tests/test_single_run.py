"""A single run started from preflight's config (runner.launch.single_run) is the run Hydra would start, and its
fork server, started before the config is known, is the one its backend gets (runner.launch.fork_server)."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import hydra
import pytest
from hydra.core.hydra_config import HydraConfig

from runner.launch import preflight, single_run
from runner.launch.fork_server import ForkServer
from runner.launch.worker import start_fixed, worker_main
from runner.locations import CONFIG_PATH

SEEN: list[str] = []


def _task(cfg) -> float:
    SEEN.append(str(HydraConfig.get().mode))
    return 7.0


def _failing(cfg) -> float:
    raise RuntimeError("the job failed")


def _hydra_files(run_dir: Path) -> dict[str, str]:
    return {name: (run_dir / ".hydra" / name).read_text() for name in ("config.yaml", "hydra.yaml", "overrides.yaml")}


def test_a_run_from_preflights_config_writes_what_hydra_writes(tmp_path, monkeypatch):
    overrides = ["backend=numpy", "tracking=none", "batch_size=4"]
    monkeypatch.setattr(sys, "argv", ["run.py", *overrides, f"hydra.run.dir={tmp_path}/hydra"])
    hydra.main(version_base="1.3", config_path=CONFIG_PATH, config_name="config")(_task)()
    checked = preflight.check([*overrides, f"hydra.run.dir={tmp_path}/here"])
    assert checked is not None and checked.as_given
    single_run.run(checked.cfg, _task, CONFIG_PATH)
    here = {
        name: text.replace(f"{tmp_path}/here", f"{tmp_path}/hydra")
        for name, text in _hydra_files(tmp_path / "here").items()
    }
    assert here == _hydra_files(tmp_path / "hydra")
    assert SEEN[-2:] == ["RunMode.RUN", "RunMode.RUN"]


def test_a_failed_job_is_reported_as_hydra_reports_it(tmp_path, capsys):
    checked = preflight.check(["tracking=none", f"hydra.run.dir={tmp_path}"])
    assert checked is not None
    with pytest.raises(SystemExit) as exited:
        single_run.run(checked.cfg, _failing, CONFIG_PATH)
    assert exited.value.code == 1
    assert "RuntimeError: the job failed" in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv",
    [["-m", "backend=numpy"], ["backend=numpy,torch"], ["hydra.job.chdir=true"], ["+experiment=sigmoid_scaling"]],
)
def test_only_the_command_line_as_typed_is_run_from_preflights_config(argv, tmp_path):
    checked = preflight.check([*argv, "tracking=none", f"hydra.sweep.dir={tmp_path}", f"hydra.run.dir={tmp_path}"])
    assert checked is not None and not checked.as_given


def test_the_spare_fork_server_goes_to_the_first_backend_and_is_ended_unclaimed(monkeypatch):
    monkeypatch.setattr(ForkServer, "_running", {})  # not the servers that earlier tests in this process left running
    monkeypatch.setattr(ForkServer, "_spare", None)
    ForkServer.start_spare(worker_main, start_fixed)
    spare = ForkServer._spare
    server = ForkServer.for_backend("runner.backends.numpy_backend", worker_main, start_fixed)
    try:
        assert server is spare and ForkServer._spare is None
        ForkServer.start_spare(worker_main, start_fixed)
        unclaimed = ForkServer._spare
        assert unclaimed is not None
        ForkServer.stop_spare()
        unclaimed.process.join(30)
        assert not unclaimed.process.is_alive() and ForkServer._spare is None
    finally:
        ForkServer._running.pop("runner.backends.numpy_backend", None)
        server.process.terminate()  # closing its connection here would not end it: this process's listener holds it
        server.process.join(30)


def test_a_spare_fork_server_imports_its_backend_before_the_rest_of_the_jobs_modules(monkeypatch, tmp_path):
    """As a user's script imports its framework first: the other way round, JAX's jitted step took 2% longer in the
    worker (BENCHMARKS.md, parity process to process). Only the runner's own modules come before it."""
    probe = tmp_path / "imported-before-the-backend"
    monkeypatch.setenv("IMPORT_ORDER_PROBE", str(probe))
    monkeypatch.setattr(ForkServer, "_running", {})
    monkeypatch.setattr(ForkServer, "_spare", None)
    ForkServer.start_spare(worker_main, start_fixed)
    server = ForkServer.for_backend("import_order_probe", worker_main, start_fixed)
    try:
        deadline = time.monotonic() + 120
        while not probe.exists() and server.alive and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.1)  # written at once, but let the writer close it
        before = probe.read_text().split()
        assert "runner.measure.job" in before
        assert [name for name in before if not name.startswith("runner.")] == []  # h5py, psutil, rich, ... after
    finally:
        ForkServer._running.pop("import_order_probe", None)
        server.process.terminate()
        server.process.join(30)

"""`runner report` (tables and plots), `runner sync` (runs kept locally while the store was away)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from helpers import FAST_TIMING, clients, free_port, identified, made_store, run_cli, runner_main

from runner import report
from runner.record import runs
from runner.report import frames, plots

# -- judging differences -------------------------------------------------------------------------


def test_compare_against_the_fastest_run_doing_the_same_work():
    rounds = np.repeat([1, 2, 3], 4)
    frame = pd.DataFrame(
        {
            "run": ["0", "1", "2", "3"],
            "status": ["FINISHED", "FINISHED", "FINISHED", "FAILED"],
            "params.model.name": ["sigmoid"] * 4,
            "params.backend.name": ["numpy", "torch", "numpy", "torch"],
            "params.model.size": [10.0, 10.0, 1000.0, 1000.0],
            "metrics.time_median_s": [2.0, 1.0, 50.0, np.nan],
            "samples_s": [2.0 + np.arange(12) * 1e-3, 1.0 + np.arange(12) * 1e-3, None, None],
            "sample_rounds": [rounds, rounds, None, None],
        }
    )
    compared = report.compare(identified(frame))
    assert list(compared["time_ratio"][:3]) == pytest.approx([2.0, 1.0, 1.0], rel=0.01)  # size 1000: its own fastest
    assert compared["time_ratio_ci_low"][0] < 2.0 < compared["time_ratio_ci_high"][0]
    assert list(compared["within_noise"]) == ["slower", "fastest", "fastest", None]


def test_runs_at_different_sizes_are_not_compared_but_named_alternatives_are():
    """Seed 001's view-vs-reshape grid: model.n is work (64 and 2048 are not compared); model.method is the
    comparison; the title names n, and the size plots know n is the size and draw a line per method."""
    frame = pd.DataFrame(
        {
            "run": list("abcd"),
            "status": ["FINISHED"] * 4,
            "params.model.name": ["reshape"] * 4,
            "params.task.name": ["inference"] * 4,
            "params.model.method": ["view", "reshape", "view", "reshape"],
            "params.model.n": ["64", "64", "2048", "2048"],
            "metrics.time_median_s": [1e-6, 2e-6, 1e-6, 9e-3],
        }
    )
    frame = frames._finish_frame(identified(frame))
    compared = report.compare(frame)
    assert list(compared["time_ratio"]) == pytest.approx([1.0, 2.0, 1.0, 9000.0])
    titles = [title for title, _ in plots.workloads(frame)]
    assert titles == ["reshape inference, model.n 2048", "reshape inference, model.n 64"]
    assert list(frame["size"]) == [64, 64, 2048, 2048] and set(frame["size_name"]) == {"model.n"}
    assert list(plots.series_labels(frame)) == ["view", "reshape", "view", "reshape"]  # a line per method


def test_params_of_run_directories_leave_out_only_recorded_copies(make_config, tmp_path):
    """A copy (model.image_size: ${data.image_size}) is no param; a literal equal to data.image_size is; a
    result.json recorded before copied_keys existed still makes a row."""
    from runner.record.job_record import write
    from runner.record.naming import job_spec
    from runner.record.result import Result

    for name, overrides in {"copy": [], "literal": ["model.image_size=64"], "older": []}.items():
        cfg = make_config("model=resnet18", "data.image_size=64", *overrides)
        (tmp_path / name).mkdir()
        write(job_spec(cfg), tmp_path / name, Result(status="FAILED", error="not run"))
    older = json.loads((tmp_path / "older" / "result.json").read_text())
    del older["copied_keys"]
    (tmp_path / "older" / "result.json").write_text(json.dumps(older))

    frame = frames.frame(runs.from_dirs(sorted(tmp_path.iterdir())))
    frame.index = [Path(d).name for d in frame["run_dir"]]
    assert list(frame["params.data.image_size"]) == [64, 64, 64]
    assert pd.isna(frame.loc["copy", "params.model.image_size"])
    assert frame.loc["literal", "params.model.image_size"] == 64
    assert frame.loc["older", "status"] == "FAILED" and frame.loc["older", "params.model.name"] == "resnet18"


# -- the CLI -------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def size_sweep(tmp_path_factory):
    """Seed 003's sigmoid benchmark in small: two sizes x two dtypes on numpy."""
    tmp = tmp_path_factory.mktemp("size-sweep")
    result = run_cli(
        "-m",
        f"tracking.uri={made_store(tmp)}",
        "tracking.experiment=sizes",
        f"hydra.sweep.dir={tmp}/sweep",
        *FAST_TIMING,
        "backend=numpy",
        "model=sigmoid",
        "task=inference",
        "model.size=1000,100000",
        "dtype=float32,float64",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return tmp


def _png_shape(path: Path) -> tuple:
    import matplotlib.image

    return matplotlib.image.imread(path).shape


def test_report_from_mlflow_writes_tables_and_plots(size_sweep, tmp_path):
    uri = f"sqlite:///{size_sweep}/mlflow.db"
    result = runner_main("report", "--tracking-uri", uri, "--experiment", "sizes", "--out", str(tmp_path))
    assert result.returncode == 0, result.stderr[-3000:]
    rows = pd.read_csv(tmp_path / "runs.csv")
    assert len(rows) == 4 and set(rows["status"]) == {"FINISHED"}  # the parent run is not a row
    assert {"model.size", "dtype", "time_median_s", "time_ratio", "within_noise"} <= set(rows.columns)
    assert {"verdict", "verdict_reason"} <= set(rows.columns)
    assert set(rows["verdict"].dropna()) <= {
        "fastest",
        "within noise",
        "slower",
        "faster",
        "no change",
        "cannot tell",
        "unstable",
    }  # values, not prose
    assert {"time_ratio_ci_low", "time_ratio_ci_high", "n_rounds", "machine_load_1m"} <= set(rows.columns)
    lines = (tmp_path / "runs.md").read_text().splitlines()
    assert len([line for line in lines if line.startswith("| ")]) == 5  # header + 4 runs
    for plot in ("time_per_config.png", "time_vs_size.png", "speedup_vs_size.png"):  # a size sweep: speedup by size
        height, width, _ = _png_shape(tmp_path / plot)
        assert height > 200 and width > 400


def test_report_over_a_sweep_is_logged_to_its_parent(size_sweep, tmp_path):
    client, (parent,), _ = clients(f"sqlite:///{size_sweep}/mlflow.db", "sizes")
    result = runner_main("report", "--sweep-dir", str(size_sweep / "sweep"), "--out", str(tmp_path))
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"logged to the parent run {parent.info.run_id}" in result.stdout
    logged = {a.path for a in client.list_artifacts(parent.info.run_id, "report")}
    assert {"report/time_vs_size.png", "report/runs.csv"} <= logged


def test_report_bad_input_is_one_line(tmp_path):
    result = runner_main("report", "--sweep-dir", str(tmp_path / "nope"), "--out", str(tmp_path / "out"))
    assert result.returncode == 2 and result.stderr.strip().count("\n") == 0 and "not a directory" in result.stderr
    uri = made_store(tmp_path)
    result = runner_main("report", "--tracking-uri", uri, "--experiment", "absent", "--out", str(tmp_path / "out"))
    assert result.returncode == 2 and "no experiment named 'absent'" in result.stderr


def test_run_while_the_server_is_down_arrives_after_sync(tmp_path):
    down = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    run_dir = tmp_path / "run"
    result = run_cli("backend=numpy", f"tracking.uri={down}", f"hydra.run.dir={run_dir}", *FAST_TIMING)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "runner sync" in result.stderr  # it says how to upload later
    assert json.loads((run_dir / "result.json").read_text())["status"] == "FINISHED"
    assert json.loads((run_dir / "tracking.json").read_text())["synced"] is False

    uri = made_store(tmp_path)
    result = runner_main("sync", str(run_dir), "--tracking-uri", uri)
    assert result.returncode == 0 and "uploaded as run" in result.stdout, result.stderr[-3000:]
    _, _, (run,) = clients(uri, "tensor-runner")
    assert run.info.status == "FINISHED" and run.data.params["backend.name"] == "numpy"
    assert "already in MLflow" in runner_main("sync", str(run_dir)).stdout  # idempotent


def test_sweep_made_offline_syncs_as_parent_and_children(tmp_path):
    down = f"http://127.0.0.1:{free_port()}"
    sweep_dir = tmp_path / "sweep"
    overrides = [f"tracking.uri={down}", f"hydra.sweep.dir={sweep_dir}", *FAST_TIMING, "backend=numpy", "seed=0,1"]
    result = run_cli("-m", *overrides)
    assert result.returncode == 0, result.stderr[-3000:]
    assert json.loads((sweep_dir / "sweep.json").read_text())["parent_run_id"] is None

    uri = made_store(tmp_path)
    result = runner_main("sync", str(sweep_dir), "--tracking-uri", uri)
    assert result.returncode == 0, result.stdout + result.stderr[-3000:]
    assert result.stdout.count("uploaded as run") == 2
    _, (parent,), children = clients(uri, "tensor-runner")
    assert parent.info.status == "FINISHED" and len(children) == 2
    assert {c.data.tags["mlflow.parentRunId"] for c in children} == {parent.info.run_id}


def test_a_sweep_made_offline_and_synced_job_by_job_ends_with_its_parent_closed(tmp_path):
    """Issue 78: the hint named each job's folder, and syncing those left the parent RUNNING. The hint names the sweep's
    folder; syncing its job folders one by one makes each its parent's child and closes the parent with the last."""
    down = f"http://127.0.0.1:{free_port()}"
    sweep_dir = tmp_path / "sweep"
    overrides = [f"tracking.uri={down}", f"hydra.sweep.dir={sweep_dir}", *FAST_TIMING, "backend=numpy", "seed=0,1"]
    result = run_cli("-m", *overrides)
    assert result.returncode == 0, result.stderr[-3000:]
    hints = [line for line in result.stderr.splitlines() if "upload them later with" in line]
    assert hints and all(line.endswith(f"runner sync {sweep_dir}") for line in hints)

    uri = made_store(tmp_path)
    first = runner_main("sync", str(sweep_dir / "0"), "--tracking-uri", uri)
    assert first.returncode == 0 and "parent run" in first.stdout and "uploaded as run" in first.stdout, first.stderr
    _, (parent,), (child,) = clients(uri, "tensor-runner")
    assert parent.info.status == "RUNNING" and child.data.tags["mlflow.parentRunId"] == parent.info.run_id
    second = runner_main("sync", str(sweep_dir / "1"), "--tracking-uri", uri)
    assert second.returncode == 0 and "uploaded as run" in second.stdout, second.stderr
    _, (parent,), children = clients(uri, "tensor-runner")
    assert parent.info.status == "FINISHED" and len(children) == 2
    assert {c.data.tags["mlflow.parentRunId"] for c in children} == {parent.info.run_id}


def test_sync_of_an_untracked_directory_says_so(tmp_path):
    result = runner_main("sync", str(tmp_path))
    assert result.returncode == 1 and "not a tracked run" in result.stderr


def test_a_server_gone_is_one_line_not_a_warning_at_each_of_mlflows_retries(monkeypatch, caplog):
    """Six raw urllib3 lines followed the runner's own once a tracking server was lost mid-sweep (issue 78)."""
    import logging

    from runner.tracking.store import client

    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "2")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR", "0")
    caplog.set_level(logging.INFO)
    with pytest.raises(Exception, match="Max retries exceeded"):
        client(f"http://127.0.0.1:{free_port()}").get_run("0" * 32)
    assert not [r for r in caplog.records if r.name.startswith("urllib3")]

"""What a run leaves behind: result.json, tensors.h5 and an MLflow run, with the documented layout."""

from __future__ import annotations

import json
import math

import h5py
import pytest

import runner.launch.isolation
from runner.measure.job import run_and_record
from runner.record.naming import job_spec

METRICS = {
    "time_median_s",
    "time_iqr_s",
    "time_mean_s",
    "time_min_s",
    "first_call_s",
    "throughput_per_s",
    "n_samples",
    "peak_host_mb",
    "max_abs_err_vs_reference",
    "max_rel_err_vs_reference",
}


def test_cli_run_tracked_in_mlflow(cli, tmp_path):
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    run_dir = tmp_path / "run"
    result = cli(
        f"tracking.uri={uri}",
        "tracking.experiment=core-test",
        f"hydra.run.dir={run_dir}",
        "timing.max_time_s=0.2",
        "backend=numpy",
    )
    assert result.returncode == 0, result.stderr
    assert "median" in result.stdout  # the summary table

    saved = json.loads((run_dir / "result.json").read_text())
    assert set(saved) >= {"status", "config", "metrics", "environment"}
    assert saved["status"] == "FINISHED"
    assert METRICS <= set(saved["metrics"])
    assert saved["config"]["backend"]["name"] == "numpy"
    assert saved["environment"]["git_commit"]

    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    experiment = client.get_experiment_by_name("core-test")
    (run,) = client.search_runs([experiment.experiment_id])
    assert run.info.status == "FINISHED"
    shown = run.data.metrics  # MLflow shows seconds as microseconds, named so; result.json keeps seconds
    assert shown["time_median_us"] == pytest.approx(saved["metrics"]["time_median_s"] * 1e6, rel=1e-3)  # 4 digits
    assert shown["first_call_us"] == pytest.approx(saved["metrics"]["first_call_s"] * 1e6, rel=1e-3)
    assert shown["throughput_per_s"] == pytest.approx(saved["metrics"]["throughput_per_s"], rel=1e-3)  # not a time
    assert not [name for name in shown if name.endswith("_s") and "per_s" not in name]
    assert "time_p50_us" not in shown  # the median again
    error = saved["metrics"]["max_rel_err_vs_reference"]  # 1e-7: its bar would read 0.00, its log10 reads -7
    assert shown["max_rel_err_vs_reference_log10"] == pytest.approx(math.log10(error), abs=1e-3)
    assert "max_rel_err_vs_reference" not in shown and "reference_tolerance" not in shown
    assert run.data.params["backend.name"] == "numpy"
    assert run.data.tags["mlflow.source.git.commit"] == saved["environment"]["git_commit"]
    assert run.data.tags["mlflow.source.git.branch"] == saved["environment"]["git_branch"]
    assert run.data.tags["mlflow.source.git.dirty"] == git_dirty()  # uncommitted code is not HEAD's
    history = sorted(client.get_metric_history(run.info.run_id, "trace/time_sample_us"), key=lambda p: p.step)
    with h5py.File(run_dir / "tensors.h5", "r") as f:
        ends_ms = [int(end * 1000) for end in f["timings/sample_end_unix_s"][()]]
        samples_us = f["timings/samples_s"][()] * 1e6
    assert [point.timestamp for point in history] == ends_ms  # each sample's own time
    assert [point.value for point in history] == pytest.approx(samples_us, rel=1e-3)
    assert all(float(f"{point.value:.4g}") == point.value for point in history)  # no raw digits in the runs list
    assert len(set(ends_ms)) > 1
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {"tensors.h5", "result.json", "hydra"} <= artifacts
    assert all(a.file_size for a in client.list_artifacts(run.info.run_id) if not a.is_dir)  # no empty file
    assert str(tmp_path) in experiment.artifact_location  # artifacts beside the SQLite store


def test_tensors_h5_layout(make_config, tmp_path):
    outcome = run_and_record(job_spec(make_config("tracking=none", "backend=numpy", "batch_size=4")), tmp_path)
    with h5py.File(tmp_path / "tensors.h5", "r") as f:
        assert f["inputs/x"].shape == (4, 32) and f["inputs/labels"].shape == (4, 2)
        assert {k: f["weights"][k].shape for k in f["weights"]} == {
            "dense.weight": (64, 32),
            "dense.bias": (64,),
            "proj.weight": (2, 64),
        }
        assert set(f["gradients"]) == {"dense.weight", "dense.bias", "proj.weight"}
        assert f["outputs/y"].shape == (4, 2)
        samples = f["timings/samples_s"][()]
        assert len(samples) == outcome.metrics["n_samples"] and (samples > 0).all()
        attrs = dict(f.attrs)
        assert {k: attrs[k] for k in ("backend", "device", "model", "dtype", "mode", "task")} == {
            "backend": "numpy",
            "device": "cpu",
            "model": "mlp",
            "dtype": "float32",
            "mode": "eager",
            "task": "gradients",
        }
        assert json.loads(attrs["environment"])["python"]


def test_records_carry_their_format_and_a_later_one_is_refused_in_one_line(make_config, tmp_path):
    from runner.record.result import FORMAT, Result, ResultUnreadable, read_samples

    run_and_record(job_spec(make_config("tracking=none", "backend=numpy")), tmp_path)
    saved = json.loads((tmp_path / "result.json").read_text())
    with h5py.File(tmp_path / "tensors.h5", "r") as f:
        assert saved["format"] == f.attrs["format"] == FORMAT
    with h5py.File(tmp_path / "tensors.h5", "a") as f:
        f.attrs["format"] = FORMAT + 1
    with pytest.raises(ResultUnreadable, match=rf"tensors.h5 is in format {FORMAT + 1}, and this tensor-runner"):
        read_samples(tmp_path)
    (tmp_path / "result.json").write_text(json.dumps({**saved, "format": FORMAT + 1}))
    with pytest.raises(ResultUnreadable, match=rf"result.json is in format {FORMAT + 1}, and this tensor-runner"):
        Result.load(tmp_path)
    del saved["format"]  # runs recorded before the key existed: format 1
    (tmp_path / "result.json").write_text(json.dumps(saved))
    assert Result.load(tmp_path).status == "FINISHED"


@pytest.mark.parametrize("isolation", ["inline", "process"])
def test_unreachable_store_keeps_results(make_config, tmp_path, isolation):
    """The tracking store cannot be opened: the run still finishes and says how to upload it later.
    (A process-isolated worker waits for its parent to open the store: it must not wait forever.)"""
    (tmp_path / "a-file").write_text("not a directory")
    cfg = make_config("backend=numpy", f"tracking.uri=sqlite:///{tmp_path}/a-file/mlflow.db", f"isolation={isolation}")
    outcome = runner.launch.isolation.execute(job_spec(cfg), tmp_path / "run")
    assert outcome.status == "FINISHED"
    assert json.loads((tmp_path / "run" / "result.json").read_text())["status"] == "FINISHED"
    note = json.loads((tmp_path / "run" / "tracking.json").read_text())
    assert note["synced"] is False and note["error"]


def test_numpy_run_imports_no_framework(tmp_path):
    """A numpy run (MLflow on) never imports torch or tensorflow: -X importtime lists every import."""
    import os
    import subprocess
    import sys

    from runner.config import PROJECT_ROOT

    result = subprocess.run(
        [
            sys.executable,
            "-X",
            "importtime",
            str(PROJECT_ROOT / "run.py"),
            "backend=numpy",
            f"tracking.uri=sqlite:///{tmp_path}/mlflow.db",
            f"hydra.run.dir={tmp_path}/run",
            "timing.max_time_s=0.1",
        ],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(PROJECT_ROOT / "src")},
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    imported = {
        line.rsplit("|", 1)[-1].strip() for line in result.stderr.splitlines() if line.startswith("import time")
    }
    assert "numpy" in imported and "mlflow" in imported
    assert not {"torch", "tensorflow", "jax"} & imported


def test_environment_says_whether_freed_memory_was_kept(make_config, tmp_path):
    for keep in (True, False):
        cfg = make_config("tracking=none", "backend=numpy", f"timing.keep_freed_memory={keep}")
        outcome = run_and_record(job_spec(cfg), tmp_path / str(keep))
        assert outcome.environment["malloc_keeps_freed_memory"] is keep


def test_keys_copied_by_interpolation_are_recorded_and_are_no_params(make_config, tmp_path):
    """model.image_size is written ${data.image_size}: result.json says so, and the copy is no param of its
    own. tracking.uri's resolvers (${oc.env:...}) make values of their own, not copies."""
    from runner.record.job_record import write
    from runner.record.naming import job_spec, run_params
    from runner.record.result import Result

    spec = job_spec(make_config("model=resnet18", "tracking=mlflow"))
    write(spec, tmp_path, Result(status="FAILED", error="not run"))
    result = Result.load(tmp_path)
    assert json.loads((tmp_path / "result.json").read_text())["copied_keys"] == {"model.image_size": "data.image_size"}
    assert result.copied_keys == {"model.image_size": "data.image_size"}
    params = run_params(result.config, result.copied_keys)
    assert "model.image_size" not in params and params["data.image_size"] == str(result.config["data"]["image_size"])


def test_a_literal_equal_to_another_key_is_a_param(make_config, tmp_path):
    """Set by the user, model.image_size is a setting of its own even where it equals data.image_size."""
    from runner.record.job_record import write
    from runner.record.naming import job_spec, run_params
    from runner.record.result import Result

    cfg = make_config("model=resnet18", "data.image_size=64", "model.image_size=64")
    write(job_spec(cfg), tmp_path, Result(status="FAILED", error="not run"))
    result = Result.load(tmp_path)
    assert result.copied_keys == {}
    assert run_params(result.config, result.copied_keys)["model.image_size"] == "64"


def test_copies_survive_the_trip_to_a_worker_process(make_config):
    """A worker gets the job's spec pickled, resolved here (Hydra's resolvers need Hydra), with the keys that copy
    another: the worker's record says which they are."""
    import pickle

    from runner.record.naming import job_spec

    spec = job_spec(make_config("model=keras", "tracking=mlflow"))
    sent = pickle.loads(pickle.dumps(spec))
    assert sent == spec
    assert sent.copied_keys == {
        "model.backend_module": "backend.module",
        "model.image_size": "data.image_size",
        "model.dtype": "dtype",
        "model.precision": "precision.name",
    }


def test_copied_keys_relative_subtrees_and_what_is_no_copy():
    from omegaconf import OmegaConf

    from runner.record.naming import copied_keys, run_params

    cfg = OmegaConf.create(
        {
            "a": {"x": 1, "sibling": "${.x}", "up": "${..b}", "text": "b=${b}", "env": "${oc.env:HOME}"},
            "b": 2,
            "whole": "${a}",
            "elsewhere": "${hydra.job.num}",  # not a key of the run's config: a value of its own
        }
    )
    copies = copied_keys(cfg)
    assert copies == {"a.sibling": "a.x", "a.up": "b", "whole": "a"}
    params = run_params(OmegaConf.to_container(cfg, resolve=False), copies)
    assert set(params) == {"a.x", "a.text", "a.env", "b", "elsewhere"}


def test_a_result_json_recorded_before_copied_keys_loads(make_config, tmp_path):
    from runner.record.job_record import write
    from runner.record.naming import job_spec
    from runner.record.result import Result

    write(job_spec(make_config("model=resnet18")), tmp_path, Result(status="FAILED", error="not run"))
    saved = json.loads((tmp_path / "result.json").read_text())
    del saved["copied_keys"]
    (tmp_path / "result.json").write_text(json.dumps(saved))
    result = Result.load(tmp_path)
    assert result.copied_keys == {} and result.config == saved["config"]


def test_every_metric_the_ui_charts_reads_something_other_than_0_00_and_reads_back():
    """MLflow's bar charts print a metric with two decimals: errors, their tolerance and energies go in a unit that
    shows them, a CPU steal of zero (any machine not a VM) is not logged; runner report reads them back."""
    from runner.tracking.run_page import stored_metric, ui_metric

    recorded = {
        "max_abs_err_vs_reference": 1.09e-05,
        "max_rel_err_vs_reference": 2.03e-07,
        "reference_tolerance": 1e-05,
        "cache_vs_recompute_max_rel_err": 3e-12,
        "energy_per_call_j": 3.2e-05,
        "examples_per_j": 1.0e06,
        "machine_steal_pct": 0.57,
        "time_median_s": 5e-08,
    }
    for name, value in recorded.items():
        shown = ui_metric(name, value)
        assert shown is not None and abs(shown[1]) >= 0.005 and f"{shown[1]:.2f}" != "0.00", name
        back = stored_metric(*shown)
        assert back[0] == name and back[1] == pytest.approx(value, rel=3e-3), name
    assert ui_metric("max_rel_err_vs_reference", 2.03e-07) == ("max_rel_err_vs_reference_log10", -6.693)
    assert ui_metric("max_abs_err_vs_reference", 0.0) is None  # exact: no logarithm (the description says 0)
    assert ui_metric("machine_steal_pct", 0.0) is None
    assert ui_metric("within_reference_tolerance", 0.0) == ("within_reference_tolerance", 0.0)  # a no, not a nothing


def git_dirty() -> str:
    """What `git status` says of the checkout the tests run in, as MLflow's dirty tag spells it."""
    import subprocess

    from runner.config import PROJECT_ROOT

    changes = subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=no"], cwd=PROJECT_ROOT, capture_output=True, text=True
    ).stdout.strip()
    return "true" if changes else "false"


def test_the_time_comparisons_use_is_logged_first_so_the_compare_page_draws_it():
    """MLflow's compare page opens its parallel-coordinates plot on a run's first metric: the typical time (what
    ratios and rates use), then the task's own figures, not the median the record opens with."""
    from runner.record.result import Result, Status
    from runner.tracking.upload import _metrics

    recorded = {"time_median_s": 1e-3, "time_iqr_s": 1e-4, "tokens_per_s": 900.0, "time_typical_s": 9e-4}
    logged = _metrics(Result(status=Status.FINISHED, metrics=recorded), None, None, 0)
    assert [m.key for m in logged] == ["time_typical_us", "tokens_per_s", "time_median_us", "time_iqr_us"]

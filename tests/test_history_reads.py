"""Reading a history leaves the store as it was (issue 74): `runner history`, with --json, --markdown and --html, and
as a gate (--fail-on), changes no byte of the store's files (a SQLite store under tmp, the kind run.py makes; the
runner reads no MLflow file store) and no run's state, tags, metrics or params; only --record writes, and the same
snapshot sees it."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
from helpers import made_store, runner_main
from test_history import CONFIG, MACHINE

from runner.history.tags import VERDICT_TAG
from runner.record.result import Result, Status
from runner.tracking.upload import log_to_mlflow


def _store(tmp_path: Path) -> tuple[str, Path]:
    """A store of 12 runs of one case an hour apart, 10% slower from the 7th (a regression to read), and the folder
    that holds all of it: its mlflow.db and the runs' artifacts beside it."""
    root = tmp_path / "store"
    uri = made_store(root)
    rng = np.random.default_rng(7)
    for i in range(12):
        value = 100e-6 * (1.1 if i >= 6 else 1.0) * math.exp(rng.normal(0, 0.01))
        metrics = {"time_typical_s": value, "time_median_s": value, "time_iqr_s": 0.0, "first_call_s": value}
        metrics["n_processes"] = 1
        run_dir = tmp_path / f"run{i:02d}"
        run_dir.mkdir()
        started = 1.79e9 + 3600 * i
        result = Result(Status.FINISHED, CONFIG, metrics, MACHINE, started=started, ended=started + 5)
        result.save(run_dir)
        log_to_mlflow(run_dir, uri, "history")
    return uri, root


def _snapshot(uri: str, root: Path) -> tuple[dict[str, bytes], dict[str, tuple]]:
    """Every file of the store, byte for byte, and every run as MLflow reads it: its state, tags, params and each
    metric's whole history."""
    from mlflow.entities import ViewType
    from mlflow.tracking import MlflowClient

    files = {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}
    client = MlflowClient(uri)
    runs = {}
    for experiment in client.search_experiments(view_type=ViewType.ALL):
        for run in client.search_runs([experiment.experiment_id], run_view_type=ViewType.ALL):
            info, data = run.info, run.data
            metrics = {
                key: [(m.value, m.timestamp, m.step) for m in client.get_metric_history(info.run_id, key)]
                for key in data.metrics
            }
            state = (info.status, info.start_time, info.end_time, info.lifecycle_stage)
            runs[info.run_id] = (state, dict(data.tags), dict(data.params), metrics)
    return files, runs


def test_reading_a_history_leaves_the_store_byte_for_byte_as_it_was(tmp_path):
    uri, root = _store(tmp_path)
    before = _snapshot(uri, root)
    assert len(before[1]) == 12 and "mlflow.db" in before[0] and len(before[0]) > 12  # the artifacts: files too

    plain = runner_main("history", "--tracking-uri", uri)
    assert plain.returncode == 0 and "regression: 1.1" in plain.stdout, plain.stderr
    as_json = runner_main("history", "--tracking-uri", uri, "--json")
    assert as_json.returncode == 0 and '"label": "regression"' in as_json.stdout, as_json.stderr
    gate = runner_main("history", "--tracking-uri", uri, "--fail-on", "regression")
    assert gate.returncode == 1 and "failing: " in gate.stderr, gate.stderr
    pages = runner_main("history", "--tracking-uri", uri, "--markdown", "--html", str(tmp_path / "pages"))
    assert pages.returncode == 0 and (tmp_path / "pages" / "index.html").is_file(), pages.stderr
    assert _snapshot(uri, root) == before

    recorded = runner_main("history", "--tracking-uri", uri, "--record")  # the one read asked to write
    assert recorded.returncode == 0, recorded.stderr
    files, runs = _snapshot(uri, root)
    newest = max(runs, key=lambda run_id: runs[run_id][0][1])
    assert runs[newest][1][VERDICT_TAG].startswith("regression: 1.1") and files != before[0]
    assert {run_id: run for run_id, run in runs.items() if run_id != newest} == {
        run_id: run for run_id, run in before[1].items() if run_id != newest
    }

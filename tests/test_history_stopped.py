"""`runner history` on a case whose newest runs were stopped (KILLED: Ctrl-C, SIGTERM from scancel or CI's timeout):
said in one line beside the failing ones, and no gate fails on it."""

from __future__ import annotations

import json
from pathlib import Path

from helpers import made_store, runner_main
from test_history import CONFIG, MACHINE

from runner.record.result import Result, Status
from runner.tracking.upload import log_to_mlflow

CASE_NAME = "numpy-mlp-gradients-eager-cpu-float32 batch_size=32"


def _night(root: Path, i: int, status: str = Status.FINISHED, error: str | None = None, **config) -> Path:
    run_dir = root / f"night-{i:02d}-{config.get('batch_size', 32)}"
    run_dir.mkdir(parents=True)
    metrics = {"time_typical_s": 1e-4, "time_median_s": 1e-4, "time_iqr_s": 0.0, "first_call_s": 1e-4}
    Result(status, {**CONFIG, **config}, metrics if status == Status.FINISHED else {}, MACHINE, error=error,
           started=1.79e9 + 86_400 * i).save(run_dir)  # fmt: skip
    return run_dir


def test_a_case_whose_newest_run_was_stopped_is_said_and_fails_no_gate(tmp_path):
    """Before: a case whose newest run CI's timeout SIGTERMed (or a user Ctrl-C'd) appeared nowhere: the history
    read finished and failed runs only. Now one line says it, in every output; --fail-on fails on none of it (a
    stopped run is no failure of the case's), and --fail-on stopped is refused. The case's next run clears it."""
    uri, ids = made_store(tmp_path / "store"), []
    for i in range(3):
        ids.append(log_to_mlflow(_night(tmp_path / "runs", i), uri, "nightly"))
        log_to_mlflow(_night(tmp_path / "runs", i, batch_size=8), uri, "nightly")
    ids.append(log_to_mlflow(_night(tmp_path / "runs", 3, Status.KILLED, "terminated (SIGTERM) while timing"), uri,
                             "nightly"))  # fmt: skip
    log_to_mlflow(_night(tmp_path / "runs", 3, batch_size=8), uri, "nightly")
    said = (
        f"{CASE_NAME} on AMD EPYC 7B13 · 2 cores · 24 GiB: stopped since run {ids[3]} (2026-09-24 14:13): 1 run "
        "stopped, the last: terminated (SIGTERM) while timing; no gate fails on a stopped run"
    )
    gate = runner_main("history", "--tracking-uri", uri, "--fail-on", "regression,failure,missing")
    assert gate.returncode == 0 and f"\n{said}\n" in gate.stdout and not gate.stderr, gate.stdout + gate.stderr
    cases = {c["case_name"]: c for c in json.loads(runner_main("history", "--tracking-uri", uri, "--json").stdout)}
    assert [(g["gap"], g["line"]) for g in cases[CASE_NAME]["gaps"]] == [("stopped", said)]
    assert all(not c["gaps"] for name, c in cases.items() if name != CASE_NAME)
    refused = runner_main("history", "--tracking-uri", uri, "--fail-on", "stopped")
    assert refused.returncode == 2 and "error: --fail-on stopped: stopped is no label" in refused.stderr
    folders = runner_main("history", str(tmp_path / "runs"), "--fail-on", "failure")
    assert folders.returncode == 0 and "night-03-32 (2026-09-24 14:13): 1 run stopped" in folders.stdout
    log_to_mlflow(_night(tmp_path / "runs", 4), uri, "nightly")
    assert "stopped since" not in runner_main("history", "--tracking-uri", uri).stdout


def test_a_stopped_control_is_said_by_its_sweeps_cases_not_as_a_case_of_its_own(tmp_path):
    import dataclasses

    from runner.history.gaps import gaps
    from runner.record.runs import IS_CONTROL_TAG, from_dirs

    (killed,) = from_dirs([_night(tmp_path, 0, Status.KILLED, "interrupted by the user (Ctrl-C) while timing")])
    assert [g.gap for g in gaps([killed])] == ["stopped"]
    assert gaps([dataclasses.replace(killed, tags={IS_CONTROL_TAG: "true"})]) == []

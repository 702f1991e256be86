"""Runs from other machines or versions: ranked only within their own setup; `runner compare` for before/after."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pandas as pd
import pytest
from helpers import FAST_TIMING, identified, made_store, run_cli, runner_main

from runner import identity, report
from runner.record import runs, setups
from runner.record.environment import driver_version
from runner.report import before_after
from runner.report.ratio import APART_SD, PROCESS_SD, time_ratio


def _frame(**columns) -> pd.DataFrame:
    """Runs as runner.report.frame has them, each on the host, CPU and framework version given (else 'x')."""
    n = len(next(iter(columns.values())))
    environments = [
        {"hostname": "x", "cpu": "x", "cpu_count": 2, "memory_gib": 24, "python": "3.11", "git_commit": "x"}
        | {k: v[i] for k, v in columns.items()}
        for i in range(n)
    ]
    rows = [{"machine": identity.machine(env).key, **setups.environment_columns(env)} for env in environments]
    return pd.DataFrame(rows)


def test_runs_share_a_setup_on_one_kind_of_machine_whatever_its_host_with_one_version_per_framework():
    frame = _frame(
        hostname=["a", "a", "a", "b", "a", "a"],
        cpu=["EPYC", "EPYC", "EPYC", "EPYC", "EPYC", "Xeon"],
        framework=["torch", "tensorflow", "torch", "torch", "tensorflow", "torch"],
        framework_version=["2.14", "2.21", "2.15", "2.14", "2.21", "2.14"],
    )
    numbers = setups.setups(frame)
    assert list(numbers) == [1, 1, 2, 1, 1, 3]  # torch 2.15 apart from 2.14; host b with a; a Xeon apart
    lines = setups.describe(frame, numbers)
    assert lines[0] == "setup 2: torch 2.15 (setup 1: 2.14); ranked only within its own setup"
    assert lines[1] == "setup 3: CPU Xeon (setup 1: EPYC); ranked only within its own setup"


def test_the_nvidia_driver_version_is_read_from_either_kernel_module_banner():
    proprietary = "NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.104.05  Sat Aug 19 01:15:15 UTC 2023\n"
    open_module = "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  550.54.14  Release Build\n"
    assert driver_version(proprietary) == "535.104.05"
    assert driver_version(open_module) == "550.54.14"


def _samples(rng: np.random.Generator, typical_s: float, n_rounds: int = 20) -> tuple[np.ndarray, np.ndarray]:
    rounds = np.repeat(np.arange(n_rounds), 5)
    return typical_s * np.exp(rng.normal(0, 0.02, len(rounds))), rounds


def _runs(rng: np.random.Generator, typical_s: float) -> pd.DataFrame:
    samples, rounds = _samples(rng, typical_s)
    return identified(
        pd.DataFrame(
            {
                "run": ["torch-mlp #0"],
                "status": ["FINISHED"],
                "params.backend.name": ["torch"],
                "params.timing.max_time_s": [1.0],
                "metrics.time_median_s": [float(np.median(samples))],
                "samples_s": [samples],
                "sample_rounds": [rounds],
            }
        )
    )


def test_runner_compare_names_each_case_one_side_alone_ran():
    """Two sweeps, numpy and torch before, numpy and jax after: the table compares numpy, and the lines under it said
    '1 case(s) of BEFORE were not run by AFTER', naming neither torch nor jax."""
    rng = np.random.default_rng(3)

    def side(*backends: str) -> pd.DataFrame:
        runs = [_runs(rng, 1e-3).assign(**{"params.backend.name": b, "run": f"{b}-mlp #0"}) for b in backends]
        return identified(pd.concat(runs, ignore_index=True).drop(columns=["case", "case_name"], errors="ignore"))

    before, after = side("numpy", "torch"), side("numpy", "jax")
    assert len(before_after.compare(before, after)) == 1
    alone = before_after.unmatched(before, after)
    assert [line.split(": ")[1] for line in alone] == ["before only", "after only"]
    assert alone[0].startswith("torch-") and alone[1].startswith("jax-"), alone


@pytest.mark.parametrize(("slowdown", "expected"), [(1.5, "slower"), (0.5, "faster"), (1.0, "within noise")])
def test_before_after_gives_the_ratio_its_interval_and_a_verdict(slowdown, expected):
    rng = np.random.default_rng(1)
    before = _runs(rng, 1e-3)
    after = _runs(rng, 1e-3 * slowdown).assign(**{"params.timing.max_time_s": [5.0]})  # budgets are not work
    compared = before_after.compare(before, after)
    row = compared.iloc[0]
    assert row["verdict"].startswith(expected)
    assert row["low"] < row["ratio"] < row["high"] and row["ratio"] == pytest.approx(slowdown, rel=0.03)
    assert row["ratio"] == pytest.approx(row["after"] / row["before"])  # the ratio of the columns beside it


def test_a_real_change_under_the_factor_is_no_change():
    rng = np.random.default_rng(2)
    row = before_after.compare(_runs(rng, 1e-3), _runs(rng, 1.15e-3), factor=1.2).iloc[0]
    assert row["low"] > 1.0 and row["verdict"] == "no change (under 1.20x)"
    assert before_after.compare(_runs(rng, 1e-3), _runs(rng, 1.15e-3)).iloc[0]["verdict"] == "slower"


def test_the_interval_of_runs_measured_apart_includes_the_machines_drift_between_sweeps():
    """Rounds that agree to 0.1% say nothing of how far the whole machine moved between the two sweeps
    (ratio.APART_SD): 6% apart is within that drift, and the interval is at least as wide as it."""
    rng = np.random.default_rng(4)
    tight = [pd.DataFrame(_runs(rng, s)) for s in (1e-3, 1.06e-3)]
    for frame in tight:
        frame.at[0, "samples_s"] = frame.at[0, "samples_s"] ** 0.05 * frame.at[0, "metrics.time_median_s"] ** 0.95
    row = before_after.compare(*tight, factor=1.02).iloc[0]
    drift_only = 1.95 * np.sqrt(2 * PROCESS_SD**2 + APART_SD**2)  # the normal quantile, a hair under t's
    assert np.log(row["high"] / row["ratio"]) >= drift_only
    assert row["verdict"] == "within noise"


def test_runs_measured_in_several_processes_compare_apart_with_their_processes_offsets_averaged():
    """A job of 3 worker processes (timing.processes) averages 3 processes' offsets, so its share of the
    interval shrinks; the machine's drift between the two sweeps does not (APART_SD)."""
    rng = np.random.default_rng(4)
    sides = [pd.DataFrame(_runs(rng, s)) for s in (1e-3, 1e-3)]
    for frame in sides:
        frame.at[0, "samples_s"] = frame.at[0, "samples_s"] ** 0.05 * frame.at[0, "metrics.time_median_s"] ** 0.95
    one = before_after.compare(*sides).iloc[0]
    for frame in sides:
        frame["sample_processes"] = [frame.at[0, "sample_rounds"] % 3]
    three = before_after.compare(*sides).iloc[0]
    one_half, three_half = np.log(one["high"] / one["ratio"]), np.log(three["high"] / three["ratio"])
    assert 1.95 * np.sqrt(2 * PROCESS_SD**2 / 3 + APART_SD**2) <= three_half < one_half
    assert three_half < 1.99 * np.sqrt(2 * PROCESS_SD**2 / 3 + APART_SD**2) + 0.003  # the rounds add little


def test_the_unpaired_interval_holds_the_true_ratio_95_times_in_100():
    """Two runs measured apart: their round numbers coincide but name different moments, so the interval
    must not pair them; each run's rounds drift on their own (a log-normal offset per round)."""
    rng = np.random.default_rng(3)
    held = 0
    for _ in range(400):
        a_rounds = np.repeat(np.arange(30), 5)
        a = np.exp(rng.normal(0, 0.05, 30))[a_rounds] * np.exp(rng.normal(0, 0.01, len(a_rounds)))
        b = 1.2 * np.exp(rng.normal(0, 0.05, 30))[a_rounds] * np.exp(rng.normal(0, 0.01, len(a_rounds)))
        ratio = time_ratio(b, a_rounds, a, a_rounds, paired=False, process_sd=0.0)
        held += ratio.low <= 1.2 <= ratio.high
    assert 0.92 <= held / 400 <= 0.98


@pytest.fixture(scope="module")
def two_versions(tmp_path_factory):
    """A numpy sweep, and a copy of it that says it ran on another numpy version, as after an upgrade."""
    tmp = tmp_path_factory.mktemp("versions")
    work = ["backend=numpy", "model=sigmoid", "task=inference", "model.size=1000,100000"]
    result = run_cli("-m", "tracking=none", f"hydra.sweep.dir={tmp}/1-before", *FAST_TIMING, *work)
    assert result.returncode == 0, result.stderr[-3000:]
    shutil.copytree(tmp / "1-before", tmp / "2-after")
    for path in (tmp / "2-after").glob("*/result.json"):
        saved = json.loads(path.read_text())
        saved["environment"]["framework_version"] = "9.9.9"
        path.write_text(json.dumps(saved))
    return tmp


def test_a_report_over_two_versions_ranks_each_run_only_within_its_version(two_versions):
    dirs = runs.runs_in(two_versions / "1-before") + runs.runs_in(two_versions / "2-after")
    frame = report.frame(runs.from_dirs(dirs))
    compared = report.compare(frame)
    assert list(frame["setup"]) == [1, 1, 2, 2]
    assert list(compared["within_noise"]) == ["fastest"] * 4  # each size alone in its setup: nothing to rank
    text = report.markdown(frame)
    assert text.splitlines()[0].startswith("| run | status | setup |")
    assert "setup 2: numpy 9.9.9 (setup 1: " in text


def test_runner_compare_prints_after_over_before_with_interval_and_verdict(two_versions):
    result = runner_main("compare", str(two_versions / "1-before"), str(two_versions / "2-after"))
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[1].startswith("what differs: numpy 9.9.9 (before: ")
    rows = [line for line in lines if line.startswith("| ") and "numpy-sigmoid" in line]
    assert len(rows) == 2  # each size matched with itself
    assert all("| 1.00x |" in row and row.endswith("| within noise |") for row in rows)  # the same data


@pytest.mark.slow  # a machine can drift beyond APART_SD between two sweeps (BENCHMARKS.md, A/A apart)
def test_two_identical_sweeps_run_one_after_the_other_are_called_neither_slower_nor_faster(tmp_path):
    """A/A apart: the same sweep twice in a row, compared as `runner compare` compares releases."""
    work = ["backend=numpy", "model=matmul", "model.n=96", "task=inference", "threads=1", "seed=0,1"]
    for side in ("a", "b"):
        result = run_cli("-m", "tracking=none", f"hydra.sweep.dir={tmp_path}/{side}", "timing.max_time_s=1", *work)
        assert result.returncode == 0, result.stderr[-3000:]
    result = runner_main("compare", str(tmp_path / "a"), str(tmp_path / "b"))
    assert result.returncode == 0, result.stderr
    rows = [line for line in result.stdout.splitlines() if line.startswith("| ") and "numpy-matmul" in line]
    assert len(rows) == 2 and not any(word in row for row in rows for word in ("| slower |", "| faster |")), rows


def test_runner_compare_bad_input_is_one_line(tmp_path):
    result = runner_main("compare", str(tmp_path), "nonexistent-run-id")
    assert result.returncode == 2
    assert result.stderr.strip() == f"error: {tmp_path} holds no run (result.json) and no sweep of runs"


def test_runner_compare_of_mlflow_sweeps_fetches_samples_the_machine_no_longer_has(tmp_path):
    uri = made_store(tmp_path)
    sweep = ["-m", f"tracking.uri={uri}", "tracking.experiment=versions", f"hydra.sweep.dir={tmp_path}/sweep"]
    result = run_cli(*sweep, *FAST_TIMING, "backend=numpy", "model=sigmoid", "task=inference", "seed=1,2")
    assert result.returncode == 0, result.stderr[-3000:]
    parent = json.loads((tmp_path / "sweep" / "sweep.json").read_text())["parent_run_id"]
    shutil.rmtree(tmp_path / "sweep")  # as on another machine: only the MLflow store and its artifacts remain
    result = runner_main("compare", parent, parent, "--tracking-uri", uri)
    assert result.returncode == 0, result.stderr
    rows = [line for line in result.stdout.splitlines() if line.startswith("| ") and "numpy-sigmoid" in line]
    assert len(rows) == 1 and rows[0].endswith("| within noise |"), result.stdout  # seeds 1 and 2: one case, pooled
    assert "| numpy-sigmoid-inference-eager-cpu-float32 batch_size=32 size=1024 |" in rows[0]


def test_a_job_refused_before_it_ran_has_no_setup_and_splits_nothing():
    frame = _frame(hostname=["a", "a", ""])
    frame.loc[2, "machine"] = None  # it recorded no environment, so it has no identity
    numbers = setups.setups(frame)
    assert list(numbers[:2]) == [1, 1] and numbers.isna()[2]
    assert setups.describe(frame, numbers) == []


def test_a_block_slurm_ended_before_it_recorded_its_machine_is_in_no_setup_and_its_row_names_its_node(tmp_path):
    """Issue 78: a lost node's block, recorded FAILED with SLURM's reason alone, was 'setup 2: CPU unknown' beside the
    sweep's finished runs. Its CPU was never read: it is in no setup, its row says FAILED on its node."""
    from test_history import MACHINE

    from runner.config import compose
    from runner.launch.slurm import record_slurm_end
    from runner.launch.slurm_queue import JobState
    from runner.record import job_record
    from runner.record.result import Result, Status
    from runner.spec import JobSpec

    spec = JobSpec.of(compose(["backend=numpy", "tracking=none"]))
    metrics = {"time_typical_s": 1e-4, "time_median_s": 1e-4, "time_iqr_s": 0.0, "first_call_s": 1e-4}
    for job, host in enumerate(("node-1", "node-3")):
        result = Result(Status.FINISHED, metrics=metrics, environment={**MACHINE, "hostname": host})
        (tmp_path / str(job)).mkdir()
        job_record.write(spec, tmp_path / str(job), result)
    lost = JobState("7_2", "NODE_FAIL", "sinfo: node-2 down* (Not responding)", "9", ": its node is lost", "node-2")
    record_slurm_end(spec, tmp_path / "2", lost)
    frame = report.frame(runs.from_path(tmp_path))
    assert list(frame["setup"][:2]) == [1, 1] and frame["setup"].isna()[2]
    assert report.setup_notes(frame) == []  # was: setup 2: CPU unknown (setup 1: AMD EPYC 7B13); ...
    headers, cells = report.human_table(frame)
    assert "setup" not in headers and headers[:3] == ["run", "status", "host"]
    assert [row[1:3] for row in cells] == [["FINISHED", "node-1"], ["FINISHED", "node-3"], ["FAILED", "node-2"]]
    assert "CPU unknown" not in report.markdown(frame) and "NODE_FAIL" in report.markdown(frame)

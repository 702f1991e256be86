"""Sweeps: one MLflow parent run with a child per job, failures recorded and survived, a summary at the end."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import h5py
import pytest
from helpers import FAST_TIMING, made_store, mlflow_runs, results, run_cli, sweep_cli

from runner.config import PROJECT_ROOT
from runner.record.naming import job_spec


@pytest.fixture(scope="module")
def failing_sweep(tmp_path_factory):
    """numpy has no bfloat16 (FAILED), torch has (FINISHED): the fast twin of numpy,torch mode=function."""
    tmp = tmp_path_factory.mktemp("failing-sweep")
    result = sweep_cli(tmp, "backend=numpy,torch", "dtype=bfloat16", "mode=eager", "batch_size=4")
    return tmp, result


def test_failed_job_fails_the_sweep_but_not_the_other_jobs(failing_sweep):
    tmp, result = failing_sweep
    assert result.returncode == 1, result.stderr[-3000:]
    saved = results(tmp)
    assert saved["0"]["status"] == "FAILED" and "bfloat16" in saved["0"]["error"]
    assert saved["1"]["status"] == "FINISHED" and saved["1"]["config"]["backend"]["name"] == "torch"
    # the summary table names every job and what failed
    assert "Sweep: 2 jobs" in result.stdout
    assert "FAILED job 0: backend=numpy cannot compute in dtype=bfloat16" in result.stdout


def test_sweep_is_one_parent_run_with_a_child_per_job(failing_sweep):
    tmp, _ = failing_sweep
    from mlflow.tracking import MlflowClient

    parents, children = mlflow_runs(tmp)
    assert len(parents) == 1 and len(children) == 2
    parent = parents[0]
    assert parent.info.status == "FAILED"  # truthful, never left RUNNING
    assert parent.data.params["backend.name"] == "numpy,torch"  # the name its jobs' params have
    assert "tracking.uri" not in parent.data.params  # where it was logged is not a param, as for its jobs
    assert parent.data.metrics["n_failed"] == 1 and parent.data.metrics["n_finished"] == 1
    assert "n_killed" not in parent.data.metrics  # none was: no bar reading 0.00
    assert {c.data.tags["mlflow.parentRunId"] for c in children} == {parent.info.run_id}
    by_backend = {c.data.params["backend.name"]: c for c in children}
    assert by_backend["numpy"].info.status == "FAILED" and "bfloat16" in by_backend["numpy"].data.tags["error"]
    assert by_backend["torch"].info.status == "FINISHED"
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp}/mlflow.db")
    artifacts = {a.path for a in client.list_artifacts(parent.info.run_id)}
    assert {"summary.md", "sweep.json", "report"} <= artifacts
    plots = {a.path for a in client.list_artifacts(parent.info.run_id, "report")}
    assert "report/time_per_config.png" in plots
    description = parent.data.tags["mlflow.note.content"]  # the answer first, then a short row per job
    assert description.startswith("**torch ")  # the one configuration that finished
    pooled, jobs = [block.splitlines() for block in description.split("\n\n") if block.startswith("|")]
    assert "time / fastest" in pooled[0] and len(pooled) == 2 + 1 and pooled[2].startswith("| torch |")
    assert len(jobs) == 2 + 2 and jobs[0].count("|") - 1 <= 8 and "p99" not in jobs[0]  # heading, rule, 2 jobs


def test_a_sweep_that_fixes_what_it_times_is_named_by_it(make_config):
    """A training sweep's parent named 'sweep backend=torch,tensorflow' did not say it timed train_step with Adam
    (issue 48): the task, optimizer, model and precision it fixes are in its name where not the defaults."""
    from runner.launch.sweep.lifecycle import timed
    from runner.record.naming import sweep_title

    said = timed(make_config("task=train_step", "optimizer=adam"), {"backend": "torch,tensorflow"})
    assert said == "train_step (adam) on mlp"
    info = {"overrides": ["backend=torch,tensorflow", "task=train_step", "optimizer=adam"], "sweep_dir": "/s"}
    assert sweep_title({**info, "timed": said}) == "sweep of train_step (adam) on mlp: backend=torch,tensorflow"
    assert timed(make_config(), {"backend": "numpy,torch"}) == ""  # the defaults: named by what it sweeps alone
    assert timed(make_config("task=train_step"), {"task": "train_step,gradients"}) == ""  # swept, not fixed
    assert timed(make_config("model=transformer", "precision=bf16_mixed"), {}) == (
        "gradients on transformer in bf16_mixed precision"
    )


def test_a_description_too_long_for_mlflow_is_cut_at_a_line_and_says_where_the_rest_is():
    from runner.tracking import NOTE_LIMIT, fit_note

    table = "".join(f"| job {i} | 1.00x |\n" for i in range(1000))
    fitted = fit_note(table)
    assert len(fitted) <= NOTE_LIMIT and fitted.endswith("summary.md among the run's artifacts)")
    assert fitted.split("\n\n(cut")[0].endswith("1.00x |")  # whole rows only
    assert fit_note("short") == "short"


@pytest.mark.slow
def test_numpy_cannot_compile_torch_can(tmp_path):
    """The README's example: numpy has no mode=function, torch.compile works (about 15 s on a CPU)."""
    result = sweep_cli(tmp_path, "backend=numpy,torch", "model=mlp", "mode=function", timeout=900)
    assert result.returncode != 0
    parents, children = mlflow_runs(tmp_path)
    assert len(parents) == 1 and parents[0].info.status == "FAILED"
    status = {c.data.params["backend.name"]: c.info.status for c in children}
    assert status == {"numpy": "FAILED", "torch": "FINISHED"}
    assert {c.data.tags["mlflow.parentRunId"] for c in children} == {parents[0].info.run_id}


def test_parallel_joblib_jobs_lose_no_runs(tmp_path):
    """2 joblib workers (the 2 cores CI has), 3 jobs, one fresh SQLite store: 3 finished children of one finished
    parent, with more jobs than workers (a worker runs another job after its first)."""
    result = sweep_cli(
        tmp_path,
        "hydra/launcher=joblib",
        "hydra.launcher.n_jobs=2",
        "backend=numpy",
        "seed=range(3)",
        timeout=600,
        new_store=True,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    parents, children = mlflow_runs(tmp_path)
    assert len(parents) == 1 and parents[0].info.status == "FINISHED"
    assert len(children) == 3 and {c.info.status for c in children} == {"FINISHED"}
    assert "timings disturb each other" in result.stdout + result.stderr  # parallel jobs are warned about (logged)
    assert sorted(int(c.data.params["seed"]) for c in children) == list(range(3))
    assert {c.data.tags["mlflow.parentRunId"] for c in children} == {parents[0].info.run_id}


def test_out_of_memory_is_a_failed_job_with_its_output_tail(tmp_path):
    """n=10^7 is refused by the memory estimate before any allocation; n=22000 passes it (its ~15 GB fit
    the machine) but not the 3.5 GB address-space limit set here, so numpy's MemoryError comes mid-job."""
    import resource

    def limit_address_space():
        resource.setrlimit(resource.RLIMIT_AS, (3_500_000_000, resource.RLIM_INFINITY))

    env = {**os.environ, "PYTHONPATH": str(PROJECT_ROOT / "src")}
    args = [
        f"tracking.uri={made_store(tmp_path)}",
        "tracking.experiment=sweeps",
        f"hydra.sweep.dir={tmp_path}/sweep",
    ]
    overrides = ["backend=numpy", "model=matmul", "task=inference", "model.n=10000000,22000,8"]
    result = subprocess.run(
        [sys.executable, str(PROJECT_ROOT / "run.py"), "-m", *args, *FAST_TIMING, *overrides],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        preexec_fn=limit_address_space,
    )
    assert result.returncode == 1
    saved = results(tmp_path)
    assert saved["0"]["status"] == "FAILED" and "needs about" in saved["0"]["error"]
    assert "of host memory" in saved["0"]["error"] and "is free" in saved["0"]["error"]
    assert saved["1"]["status"] == "FAILED" and "MemoryError: Unable to allocate" in saved["1"]["error"]
    assert "note: one call ≈" in saved["1"]["output_tail"]  # what the job printed: its cost, announced up front
    assert saved["2"]["status"] == "FINISHED"
    _, children = mlflow_runs(tmp_path)
    failed = [c for c in children if c.info.status == "FAILED"]
    assert len(failed) == 2 and any("Unable to allocate" in c.data.tags.get("error", "") for c in failed)


def _start_sweep(tmp: Path, *overrides: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(PROJECT_ROOT / "src")}
    args = [f"tracking.uri={made_store(tmp)}", "tracking.experiment=sweeps", f"hydra.sweep.dir={tmp}/sweep"]
    return subprocess.Popen(
        [sys.executable, str(PROJECT_ROOT / "run.py"), "-m", *args, *FAST_TIMING, *overrides],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own process group, like a terminal's foreground job
    )


def _worker_of(proc: subprocess.Popen, timeout_s: float = 120):
    """The worker process measuring the current job (forked by its backend's fork server, named runner-job-N)."""
    import psutil

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for child in psutil.Process(proc.pid).children(recursive=True):
            try:
                if child.name().startswith("runner-job"):
                    return child
            except psutil.Error:  # a short-lived helper (git, a resource tracker) that has exited
                continue
        time.sleep(0.05)
    raise AssertionError("no worker process appeared")


def test_a_killed_worker_fails_its_job_and_the_sweep_goes_on(tmp_path):
    # job 0 would time for 60 s; job 1 is quick
    proc = _start_sweep(
        tmp_path, "backend=numpy", "timing.target_rel_iqr=0", "timing.max_time_s=60,0.2", "timing.rounds=1"
    )
    _worker_of(proc).send_signal(signal.SIGKILL)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 1, err[-3000:]
    saved = results(tmp_path)
    assert saved["0"]["status"] == "FAILED" and "killed by signal SIGKILL" in saved["0"]["error"]
    assert saved["1"]["status"] == "FINISHED"
    assert "FAILED job 0" in out
    parents, children = mlflow_runs(tmp_path)
    assert parents[0].info.status == "FAILED"
    assert sorted(c.info.status for c in children) == ["FAILED", "FINISHED"]


# SIGTERM to the launcher alone: test_rounds.py's default case (in the rounds); here in the heavy set
@pytest.mark.parametrize("how", ["ctrl-c", pytest.param("sigterm", marks=pytest.mark.heavy)])
def test_ctrl_c_kills_the_running_job_keeps_its_samples_and_stops_the_sweep(tmp_path, how):
    proc = _start_sweep(
        tmp_path, "backend=numpy", "timing.target_rel_iqr=0", "timing.max_time_s=60", "seed=0,1", "timing.rounds=1"
    )
    _worker_of(proc)
    log = tmp_path / "sweep" / "0" / "job.log"
    deadline = time.monotonic() + 120
    while "timing numpy" not in (log.read_text() if log.exists() else ""):  # the progress line: it is timing
        assert time.monotonic() < deadline and proc.poll() is None
        time.sleep(0.1)
    if how == "ctrl-c":
        os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C in a terminal does: the whole foreground group
    else:
        proc.send_signal(signal.SIGTERM)  # scancel or kill: only the launching process hears it
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err[-3000:]
    saved = results(tmp_path)
    assert list(saved) == ["0"]  # the sweep stopped: job 1 never started
    assert saved["0"]["status"] == "KILLED" and saved["0"]["metrics"]["n_samples"] > 0
    with h5py.File(tmp_path / "sweep" / "0" / "tensors.h5") as f:
        assert len(f["timings/samples_s"]) == saved["0"]["metrics"]["n_samples"]
    parents, children = mlflow_runs(tmp_path)
    assert parents[0].info.status == "KILLED" and [c.info.status for c in children] == ["KILLED"]


# An inline sweep's jobs recorded without a worker: the default set's in test_user_paths.py
# (test_both_frameworks_in_one_process_in_either_order)
@pytest.mark.heavy
def test_inline_isolation_records_the_same_files(tmp_path):
    result = sweep_cli(tmp_path, "backend=numpy", "isolation=inline", "batch_size=2,3")
    assert result.returncode == 0, result.stderr[-3000:]
    saved = results(tmp_path)
    assert [r["config"]["batch_size"] for r in saved.values()] == [2, 3]
    assert all(r["status"] == "FINISHED" and r["config"]["isolation"] == "inline" for r in saved.values())
    assert not (tmp_path / "sweep" / "0" / "job.log").exists()  # no worker ran


# An untracked sweep's table and summary: the default set's in test_rounds.py
# (test_one_round_measures_the_jobs_one_after_the_other)
@pytest.mark.heavy
def test_untracked_sweep_still_summarises(tmp_path):
    result = run_cli(
        "-m", "tracking=none", f"hydra.sweep.dir={tmp_path}/sweep", *FAST_TIMING, "backend=numpy", "seed=1,2"
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Sweep: 2 jobs" in result.stdout
    assert (tmp_path / "sweep" / "summary.md").exists()
    assert not (tmp_path / "mlflow.db").exists()


@pytest.mark.parametrize("hold_s", [3, pytest.param(25, marks=pytest.mark.slow)])
def test_a_locked_store_still_gets_the_run(make_config, tmp_path, hold_s):
    """Another connection holds the SQLite store's write lock. MLflow's SQLite sessions wait up to 20 s
    (busy_timeout); a longer lock makes them fail with 'database is locked' and tracking.retry_on_lock
    tries again."""
    import sqlite3
    import threading

    from runner.launch import isolation

    uri = made_store(tmp_path)
    cfg = make_config("backend=numpy", "isolation=inline", f"tracking.uri={uri}", "tracking.experiment=locked")
    isolation.execute(job_spec(cfg), tmp_path / "first")  # the experiment's first run
    locked, release = threading.Event(), threading.Event()

    def hold_lock():
        con = sqlite3.connect(tmp_path / "mlflow.db", isolation_level=None)
        con.execute("BEGIN EXCLUSIVE")
        locked.set()
        release.wait(hold_s)
        con.execute("COMMIT")
        con.close()

    holder = threading.Thread(target=hold_lock)
    holder.start()
    locked.wait()
    try:
        outcome = isolation.execute(job_spec(cfg), tmp_path / "second")
    finally:
        release.set()
        holder.join()
    assert outcome.status == "FINISHED"
    assert json.loads((tmp_path / "second" / "tracking.json").read_text())["synced"] is True
    _, children = mlflow_runs(tmp_path, "locked")
    assert len(children) == 2


PLUGIN = PROJECT_ROOT / "tests" / "plugin"


@pytest.mark.parametrize("measured_in", ["task", "rounds"])
def test_hydra_callbacks_see_each_jobs_median_in_its_task_and_in_rounds(tmp_path, monkeypatch, measured_in):
    """Hydra's callbacks get what each job returns, once per job: its median seconds per call, measured in its
    task (timing.rounds=1) or in the interleaved rounds; NaN for a job that failed."""
    import math

    monkeypatch.setenv("PYTHONPATH", str(PLUGIN))
    probe = tmp_path / "returns.jsonl"
    result = sweep_cli(
        tmp_path,
        "+hydra.callbacks.probe._target_=return_probe.ReturnProbe",
        f"+hydra.callbacks.probe.path={probe}",
        "timing.rounds=1" if measured_in == "task" else "timing.rounds=2",
        "backend=numpy",
        "mode=function,eager",  # numpy cannot compile: job 0 fails
        "tracking=none",  # what Hydra's callbacks get does not go through MLflow (the other sweeps here log to it)
    )
    assert result.returncode == 1, result.stderr[-3000:]
    returned = [json.loads(line) for line in probe.read_text().splitlines()]
    assert sorted(r["job"] for r in returned) == [0, 1]  # each job ends once
    returned = {r["job"]: r["value"] for r in returned}
    saved = results(tmp_path)
    assert math.isnan(returned[0]) and saved["0"]["status"] == "FAILED"  # refused before any measurement
    assert returned[1] == saved["1"]["metrics"]["time_median_s"] and saved["1"]["metrics"]["n_rounds"] == (
        1 if measured_in == "task" else 2
    )


def test_an_optimizing_sweeper_gets_every_jobs_median_from_the_rounds(tmp_path, monkeypatch):
    """A sweeper that reads each batch's values before it picks the next (as Optuna's does) gets the
    median of every job, measured in interleaved rounds within each batch."""
    monkeypatch.setenv("PYTHONPATH", str(PLUGIN))
    out = tmp_path / "sweeper.jsonl"
    result = sweep_cli(
        tmp_path,
        f"hydra.searchpath=[file://{PLUGIN / 'conf'}]",
        "hydra/sweeper=fastest",
        f"hydra.sweeper.out={out}",
        "timing.rounds=2",
        "backend=numpy",
        "batch_size=2,4,8",
        "tracking=none",  # what the sweeper gets does not go through MLflow (the other sweeps here log to it)
    )
    assert result.returncode == 0, result.stderr[-3000:]
    got = [json.loads(line) for line in out.read_text().splitlines()]
    saved = results(tmp_path)
    assert [g["value"] for g in got] == [saved[str(j)]["metrics"]["time_median_s"] for j in range(3)]
    assert all(saved[str(j)]["metrics"]["n_rounds"] == 2 for j in range(3))


def test_a_launcher_added_from_outside_runs_and_records_every_job(tmp_path, monkeypatch):
    """A launcher is two files (tests/plugin/hydra_plugins/reverse_launcher.py and its yaml): this one runs the
    jobs last first; the sweep is one parent run with a child per job, as with the runner's own launchers."""
    monkeypatch.setenv("PYTHONPATH", str(PLUGIN))
    result = sweep_cli(
        tmp_path, f"hydra.searchpath=[file://{PLUGIN / 'conf'}]", "hydra/launcher=reverse", "backend=numpy", "seed=0,1"
    )
    assert result.returncode == 0, result.stderr[-3000:]
    saved = results(tmp_path)
    assert saved["1"]["started"] < saved["0"]["started"]
    parents, children = mlflow_runs(tmp_path)
    assert parents[0].info.status == "FINISHED" and len(children) == 2

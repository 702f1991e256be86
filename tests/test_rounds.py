"""Interleaved rounds: a sweep's jobs take turns measuring in live workers; samples pool per job; each job
is compared with the fastest with a 95% interval; a worker lost in a round loses nothing else."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import h5py
import numpy as np
import pandas as pd
import pytest
from helpers import FAST_TIMING, made_store, mlflow_runs, results, sweep_cli

from runner.config import PROJECT_ROOT
from runner.launch.rounds import takes_part


def _samples(job_dir: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    with h5py.File(job_dir / "tensors.h5") as f:
        return f["timings/samples_s"][()], f["timings/sample_round"][()], f["timings/sample_end_unix_s"][()]


@pytest.fixture(scope="module")
def three_jobs(tmp_path_factory):
    """Three numpy jobs doing the same work (only the seed differs) in 4 rounds, 2 processes each. The budget pays for
    both processes with room to spare (measure.timing.affordable_processes: at 0.6 s a loaded machine's slower blocks
    afforded one, and the rotation below was not there to see)."""
    tmp = tmp_path_factory.mktemp("rounds")
    out = sweep_cli(
        tmp, "backend=numpy", "seed=0,1,2", "timing.rounds=4", "timing.processes=2", "timing.max_time_s=1.2"
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return tmp, out


def test_rounds_interleave_in_alternating_order(three_jobs):
    """The sample timestamps prove it: in round 1 job 0's samples all end before job 1's, then job 2's;
    round 2 runs 2, 1, 0; and so on."""
    tmp, _ = three_jobs
    spans = {}  # (job, round) -> (first end, last end)
    for job in range(3):
        _, rounds, ends = _samples(tmp / "sweep" / str(job))
        assert sorted(set(rounds)) == [1, 2, 3, 4]
        for r in range(1, 5):
            spans[job, r] = (ends[rounds == r].min(), ends[rounds == r].max())
    for r in range(1, 5):
        order = [0, 1, 2] if r % 2 else [2, 1, 0]
        for before, after in zip(order, order[1:], strict=False):
            assert spans[before, r][1] < spans[after, r][0], f"round {r}: job {before} overlaps job {after}"
        if r < 4:  # a round ends before the next begins
            assert max(spans[j, r][1] for j in range(3)) < min(spans[j, r + 1][0] for j in range(3))


def test_samples_are_pooled_per_job_and_compared_with_an_interval(three_jobs):
    tmp, out = three_jobs
    for job, saved in results(tmp).items():
        samples, rounds, _ = _samples(tmp / "sweep" / job)
        assert saved["metrics"]["n_samples"] == len(samples) == len(rounds)
        assert saved["metrics"]["n_rounds"] == 4
        with h5py.File(tmp / "sweep" / job / "tensors.h5") as f:  # timing.processes=2: they take turns in rotation
            processes = f["timings/sample_process"][()]
        assert [set(processes[rounds == r]) for r in range(1, 5)] == [{0}, {1}, {0}, {1}]
        assert saved["metrics"]["time_median_s"] == pytest.approx(float(np.median(samples)))
        assert "machine_other_runnable" in saved["metrics"]
    rows = pd.read_csv(tmp / "sweep" / "report" / "runs.csv")
    others = rows[rows["within_noise"] != "fastest"]
    assert len(others) == 2 and set(others["within_noise"]) <= {"within noise", "slower"}
    assert (others["time_ratio_ci_low"] <= others["time_ratio"]).all()
    assert (others["time_ratio"] <= others["time_ratio_ci_high"]).all()
    assert "95% interval" in (tmp / "sweep" / "summary.md").read_text() and "95% interval" in out.stdout
    _, children = mlflow_runs(tmp)
    compared = [c for c in children if "time_ratio_ci_low" in c.data.metrics]
    assert len(compared) == 2 and all("95% interval" in c.data.tags["mlflow.note.content"] for c in compared)


def test_one_round_measures_the_jobs_one_after_the_other(tmp_path):
    out = sweep_cli(tmp_path, "backend=numpy", "seed=0,1", "timing.rounds=1", "tracking=none")  # three_jobs: MLflow
    assert out.returncode == 0, out.stderr[-3000:]
    (_, _, ends0), (_, _, ends1) = (_samples(tmp_path / "sweep" / j) for j in "01")
    assert ends0.max() < ends1.min()
    assert "interleaved rounds" not in out.stderr
    assert "Sweep: 2 jobs" in out.stdout and (tmp_path / "sweep" / "summary.md").exists()  # untracked, summarised
    rows = pd.read_csv(tmp_path / "sweep" / "report" / "runs.csv")
    assert set(rows["within_noise"]) <= {"fastest", "cannot tell (1 round)"}


def test_a_job_with_fewer_turns_spreads_them_over_the_rounds():
    assert [i for i in range(40) if takes_part(i, 10, 40)] == list(range(3, 40, 4))
    assert all(takes_part(i, 40, 40) for i in range(40))
    assert [i for i in range(7) if takes_part(i, 1, 7)] == [6]


# -- nothing lost ----------------------------------------------------------------------------------


def _start(tmp: Path, *overrides: str) -> tuple[subprocess.Popen, list[str]]:
    """A sweep in its own process group; its output lines (stdout and stderr: where the progress lines go is
    hydra/hydra_logging's choice) are collected as they come."""
    env = {**os.environ, "PYTHONPATH": str(PROJECT_ROOT / "src")}
    args = [f"tracking.uri={made_store(tmp)}", "tracking.experiment=sweeps", f"hydra.sweep.dir={tmp}/sweep"]
    proc = subprocess.Popen(
        [sys.executable, str(PROJECT_ROOT / "run.py"), "-m", *args, *FAST_TIMING, *overrides],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    lines: list[str] = []
    threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True).start()
    return proc, lines


def _wait_for(lines: list[str], text: str, proc: subprocess.Popen, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while not any(text in line for line in lines):
        assert proc.poll() is None and time.monotonic() < deadline, "".join(lines)[-3000:]
        time.sleep(0.05)


def _workers(proc: subprocess.Popen, job: int | None = None, process: int = 0) -> list:
    """The sweep's worker processes, oldest first; with `job`, that job's `process` (0: the one that records it)."""
    import psutil

    def comm(child) -> str:  # the name the worker gave itself (psutil's name() may swap a 15-letter one for argv's)
        try:
            return Path(f"/proc/{child.pid}/comm").read_text().strip()
        except FileNotFoundError:  # a child that ended between the listing and the read (a short-lived helper)
            return ""

    children = [c for c in psutil.Process(proc.pid).children(recursive=True) if comm(c).startswith("runner-job")]
    if job is not None:
        name = f"runner-job-{job}" + (f".{process}-" if process else "")
        children = [c for c in children if comm(c) == name]
    return sorted(children, key=lambda c: c.create_time())


# 20 turns of 0.2 s per job, 10 in each of its 2 processes, all of them taken
SLOW_ROUNDS = ("timing.rounds=20", "timing.processes=2", "timing.max_time_s=4", "timing.resolve=0")


def test_a_worker_killed_in_a_round_keeps_its_earlier_rounds_and_the_others_finish(tmp_path, own_tmpdir):
    """Job 1's first process (the one that records it) dies: job 1 is FAILED with the samples it reported. Job 0's
    second process dies: job 0 loses only that process's turns (its first takes the rest and records it)."""
    proc, lines = _start(tmp_path, "backend=numpy", "seed=0,1", *SLOW_ROUNDS)
    _wait_for(lines, "round 1 of 20 done", proc)
    _workers(proc, job=1)[0].send_signal(signal.SIGKILL)
    _workers(proc, job=0, process=1)[0].send_signal(signal.SIGKILL)
    rest, _ = proc.communicate(timeout=300)  # what the line-collecting thread did not read first
    output = "".join(lines) + rest
    assert proc.returncode == 1, output[-3000:]
    assert "warning: #0: its process 1 stopped in round" in output, output[-3000:]
    saved = results(tmp_path)
    assert saved["0"]["status"] == "FINISHED" and 10 <= saved["0"]["metrics"]["n_rounds"] < 20
    _, rounds, _ = _samples(tmp_path / "sweep" / "0")
    with h5py.File(tmp_path / "sweep" / "0" / "tensors.h5") as f:
        processes = f["timings/sample_process"][()]
    assert len(set(rounds[processes == 0])) == 10  # its first process's 10 turns, all taken
    assert not list(own_tmpdir.glob("0.1-runner-process-*"))  # the dead one's directory is gone
    lost = saved["1"]
    assert lost["status"] == "FAILED" and "killed by signal SIGKILL" in lost["error"] and "in round" in lost["error"]
    assert "samples it reported are kept" in lost["error"]
    samples, rounds, _ = _samples(tmp_path / "sweep" / "1")
    assert lost["metrics"]["n_samples"] == len(samples) > 0 and 1 <= rounds.max() < 20
    parents, children = mlflow_runs(tmp_path)
    assert parents[0].info.status == "FAILED" and sorted(c.info.status for c in children) == ["FAILED", "FINISHED"]


# Ctrl-C to the whole group: test_sweep.py's default case (a job measured in its task); here in the heavy set
@pytest.mark.parametrize("how", [pytest.param("ctrl-c", marks=pytest.mark.heavy), "sigterm"])
def test_stopping_a_sweep_in_its_rounds_records_every_job_killed_with_its_samples(tmp_path, how):
    proc, lines = _start(tmp_path, "backend=numpy", "seed=0,1", *SLOW_ROUNDS)
    _wait_for(lines, "round 1 of 20 done", proc)
    if how == "ctrl-c":
        os.killpg(proc.pid, signal.SIGINT)  # the terminal's foreground group: launcher and workers
    else:
        proc.send_signal(signal.SIGTERM)  # only the launcher hears it
    rest, _ = proc.communicate(timeout=120)
    assert proc.returncode == 130, ("".join(lines) + rest)[-3000:]
    saved = results(tmp_path)
    assert [saved[j]["status"] for j in "01"] == ["KILLED", "KILLED"]
    word = "Ctrl-C" if how == "ctrl-c" else "SIGTERM"
    assert all(word in saved[j]["error"] and saved[j]["metrics"]["n_samples"] > 0 for j in "01")
    parents, children = mlflow_runs(tmp_path)
    assert parents[0].info.status == "KILLED" and [c.info.status for c in children] == ["KILLED", "KILLED"]

"""The record survives the death of any one process, a store's first use by several
processes, an unwritable store and bad values; nothing hangs, nothing is uploaded twice."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from fake_clock import FakeClock
from helpers import FAST_TIMING, PROJECT_ROOT, _env, clients, compose_config, run_cli, runner_cli, runner_main

from runner import cli, tracking
from runner.config import ConfigError
from runner.launch import isolation, preflight
from runner.launch.fork_server import ForkedWorker
from runner.measure.figures import non_finite_warnings
from runner.measure.job import run_and_record
from runner.measure.samples import Samples
from runner.measure.stop import Stopped, stop_reason
from runner.measure.timing import LoopSettings, measure
from runner.models.mlp import MLP
from runner.models.op_workloads import Matmul, Sigmoid
from runner.record.naming import job_spec
from runner.record.result import LOG_FILE, RESULT_FILE, TENSORS_FILE, Result, write_tensors
from runner.record.sweep_file import write_sweep_file

# -- item 4 and 6-7: bad values are one line before anything runs ---------------------------------

REFUSED = {
    "timing.max_time_s=nan": "timing.max_time_s=nan: must be a finite number > 0.0",
    "timing.max_time_s=inf": "timing.max_time_s=inf",
    "timing.max_time_s=1e308": "timing.max_time_s=1e+308",
    "timing.max_time_s=-1": "timing.max_time_s=-1.0",
    "timing.warmup_s=inf": "timing.warmup_s=inf",
    "timing.min_block_s=nan": "timing.min_block_s=nan",
    "timing.min_block_s=inf": "timing.min_block_s=inf",
    "timing.min_block_s=1e9": "timing.min_block_s=1000000000.0",
    "timing.min_repeats=0": "timing.min_repeats=0",
    "timing.target_rel_iqr=-0.1": "timing.target_rel_iqr=-0.1",
    "~model": "no model is chosen (~model removed it): choose one of alexnet,",
    "~backend": "no backend is chosen (~backend removed it): choose one of jax, numpy,",
    "tracking.uri=": "tracking.uri is empty",
    "tracking.experiment=": "tracking.experiment is empty",
    "tracking.experiment=../../../../tmp/x": "tracking.experiment='../../../../tmp/x': a name, not a path",
    f"tracking.experiment={'e' * 600}": "tracking.experiment is 600 characters long: at most 256",
    "tracking.uri=sqlite:////nonexistent/dir/x.db": "the folder /nonexistent/dir does not exist",
    "tracking.uri=garbage://x": "tracking.uri=garbage://x: MLflow has no store for garbage://",
    "tracking.uri=postgresql://u@localhost/db": "the postgresql store needs the Python module psycopg2",
    "tracking.uri=mysql+pymysql://u@localhost/db": "the mysql+pymysql store needs the Python module pymysql",
    "hydra.run.dir=/proc/runner-x": "hydra.run.dir=/proc/runner-x: cannot create folders in /proc",
    "hydra.run.dir=/etc/hostname/x": "hydra.run.dir=/etc/hostname/x: /etc/hostname is a file, not a folder",
    "tracking.name=x": "tracking.name=x: tracking.name says which tracking was chosen, it is not a setting",
    "model.name=resnet18": "model.name=resnet18: model.name says which model was chosen",
}


@pytest.mark.parametrize("override", sorted(REFUSED))
def test_bad_values_are_refused_with_one_line(override):
    with pytest.raises(preflight.BadInput) as refused:
        preflight.check_argv([override])
    assert REFUSED[override] in str(refused.value)
    assert "\n" not in str(refused.value)


def test_a_data_setting_the_run_does_not_read_is_named_in_one_warning(capsys):
    preflight.check_argv(["data.image_size=0", "data.path=photos", "batch_size=2"])  # the MLP, random inputs
    warnings = [line for line in capsys.readouterr().err.splitlines() if line.startswith("warning")]
    assert warnings == [
        "warning: this run does not read data.image_size=0, data.path=photos: "
        "its task, model and data have no use for it"
    ]
    preflight.check_argv(["model=resnet18", "backend=torch", "data.image_size=64"])
    assert "warning" not in capsys.readouterr().err


@pytest.mark.parametrize(
    ("key", "good", "bad"),
    [
        ("timing.max_time_s", "1", "nan"),
        ("timing.min_repeats", "3", "0"),
        ("seed", "0", "x"),
        ("tracking.experiment", "a", "../../../../tmp/x"),
        ("backend", "numpy", "nope"),
    ],
)
def test_bad_values_in_a_sweep_are_refused_in_the_words_they_get_alone(key, good, bad):
    """A sweep's later value is checked on the first job's config (a plain value) or composed (a group's)."""
    with pytest.raises(preflight.BadInput) as alone:
        preflight.check_argv([f"{key}={bad}"])
    with pytest.raises(preflight.BadInput) as swept:
        preflight.check_argv(["-m", f"{key}={good},{bad}", "mode=eager,function"])
    assert str(swept.value) == str(alone.value)


def test_removed_group_exits_2_without_traceback():
    done = run_cli("~model", timeout=120)
    assert done.returncode == 2
    assert "Traceback" not in done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("error")]  # a shared venv may warn above
    models = ", ".join(sorted(p.stem for p in (PROJECT_ROOT / "conf" / "model").glob("*.yaml")))
    assert errors == [f"error: no model is chosen (~model removed it): choose one of {models}"]


@pytest.mark.parametrize(
    ("build", "line"),
    [
        (lambda: MLP(hidden=0), "model.hidden=0: must be a positive integer"),
        (lambda: Matmul(n=0), "model.n=0: must be a positive integer"),
        (lambda: Sigmoid(size=-3), "model.size=-3: must be a positive integer"),
    ],
)
def test_model_sizes_must_be_positive(build, line):
    with pytest.raises(ConfigError, match=line):
        build()


def test_zero_size_is_a_failed_run_not_a_throughput(tmp_path):
    result = run_and_record(
        job_spec(compose_config("model=matmul", "task=inference", "model.n=0", "tracking=none")), tmp_path
    )
    assert (result.status, result.error) == ("FAILED", "model.n=0: must be a positive integer")
    assert "throughput_per_s" not in result.metrics


# -- item 4: max_time_s bounds warm-up and calibration -------------------------------------------


def test_max_time_bounds_warm_up_and_says_so():
    clock = FakeClock()
    measurement, _ = measure(
        clock.step(0.001),
        lambda: None,
        LoopSettings(min_warmup_calls=10**12, max_time_s=0.05, min_repeats=1),
        clock=clock,
    )
    assert measurement.warmup_cut_short
    assert measurement.samples_s  # the rest of the budget still measured


def test_max_time_bounds_block_calibration():
    clock = FakeClock()
    measurement, _ = measure(
        clock.step(0.001), lambda: None, LoopSettings(min_block_s=60.0, max_time_s=0.05, min_repeats=1), clock=clock
    )
    assert measurement.warmup_cut_short
    assert measurement.samples_s


def test_warm_up_cut_short_is_in_the_result(tmp_path):
    result = run_and_record(job_spec(compose_config("timing.min_warmup_calls=1000000000", "tracking=none")), tmp_path)
    assert result.status == "FINISHED"
    assert any(w.startswith("warm-up cut short by timing.max_time_s=0.2") for w in result.warnings)
    assert "warm-up cut short" in Result.load(tmp_path).warnings[0]


# -- item 7: NaN outputs are said; stale files are cleared; links are never followed --------------


def test_nan_inputs_warn_in_the_result_and_the_summary(tmp_path, monkeypatch, capsys):
    from runner.launch.terminal import print_summary

    def nan_inputs(self, rng, batch_size):
        x = rng.standard_normal((batch_size, self.in_features))
        x[0, 0] = np.nan
        return {"x": x, "labels": rng.standard_normal((batch_size, self.out_features))}

    monkeypatch.setattr(MLP, "make_inputs", nan_inputs)
    cfg = compose_config("tracking=none")
    result = run_and_record(job_spec(cfg), tmp_path)
    assert result.status == "FINISHED"
    assert "outputs/y holds 2 NaN or infinite values of 64" in result.warnings
    print_summary(tmp_path, result)
    assert "warning: outputs/y holds 2 NaN or infinite values of 64" in capsys.readouterr().err


def test_non_finite_warnings_name_each_tensor():
    tensors = {"inputs/x": np.array([np.nan]), "outputs/y": np.array([1.0, np.inf]), "gradients/w": np.ones(3)}
    assert non_finite_warnings(tensors) == ["outputs/y holds 1 NaN or infinite values of 2"]


def test_a_reused_run_directory_keeps_nothing_of_the_previous_run(tmp_path):
    (tmp_path / TENSORS_FILE).write_text("the previous run's tensors")
    (tmp_path / "images").mkdir()
    (tmp_path / tracking.TRACKING_FILE).write_text("{}")
    result = isolation.execute(
        job_spec(compose_config("model.hidden=0", "tracking=none", "isolation=inline")), tmp_path
    )
    assert result.status == "FAILED"
    assert not (tmp_path / TENSORS_FILE).exists()
    assert not (tmp_path / "images").exists()
    assert not (tmp_path / tracking.TRACKING_FILE).exists()


def test_links_in_a_run_directory_are_replaced_not_followed(tmp_path):
    victim_json, victim_h5 = tmp_path / "victim.json", tmp_path / "victim.h5"
    victim_json.write_text("keep"), victim_h5.write_text("keep")
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / RESULT_FILE).symlink_to(victim_json)
    (run_dir / TENSORS_FILE).symlink_to(victim_h5)
    Result(status="FINISHED").save(run_dir)
    write_tensors(run_dir / TENSORS_FILE, {"x": np.ones(2)}, {})
    assert victim_json.read_text() == victim_h5.read_text() == "keep"
    assert not (run_dir / RESULT_FILE).is_symlink() and Result.load(run_dir).status == "FINISHED"
    assert not (run_dir / TENSORS_FILE).is_symlink()


def test_a_killed_job_counts_its_real_examples(tmp_path, monkeypatch):
    from runner.measure import timing

    def stopped(*args, **kwargs):
        measurement = timing.Measurement(first_call_s=0.1, samples=Samples({"samples_s": [0.5, 0.5, 0.5]}))
        raise timing.MeasurementInterrupted(measurement) from Stopped("terminated (SIGTERM)")

    monkeypatch.setattr(timing, "measure", stopped)
    result = run_and_record(job_spec(compose_config("tracking=none", "batch_size=8")), tmp_path)
    assert (result.status, result.error) == ("KILLED", "terminated (SIGTERM) while timing")
    assert result.metrics["throughput_per_s"] == 16.0  # 8 examples per call, 0.5 s per call


def test_sigterm_is_not_called_ctrl_c():
    assert stop_reason(Stopped("terminated (SIGTERM)")) == "terminated (SIGTERM)"
    assert stop_reason(RuntimeError("in a callback")) == "interrupted by the user (Ctrl-C)"
    assert stop_reason(KeyboardInterrupt()) == "interrupted by the user (Ctrl-C)"


# -- items 1-3 and 5: the store, the record, sync ---------------------------------------------------


def test_a_store_in_a_missing_folder_fails_at_once_and_creates_nothing(tmp_path):
    uri = f"sqlite:///{tmp_path}/absent/dir/x.db"
    with pytest.raises(ConfigError, match=f"tracking.uri={uri}: the folder {tmp_path}/absent/dir does not exist"):
        tracking.check_reachable(uri)
    assert not (tmp_path / "absent").exists()


def test_a_store_folder_one_level_new_is_made(tmp_path):
    uri = f"sqlite:///{tmp_path}/outputs/mlflow.db"  # the default store in a fresh clone
    tracking.check_reachable(uri)
    tracking.open_store(uri)
    assert (tmp_path / "outputs" / "mlflow.db").is_file()


def test_no_store_folder_is_made_at_the_root():
    with pytest.raises(ConfigError, match="the folder /runner-nonexistent does not exist"):
        tracking.check_store_path("sqlite:////runner-nonexistent/x.db")


def _tracked_run(tmp_path: Path, name: str = "run") -> tuple[Path, str]:
    """A finished inline run whose tracking.json is pending, as if its launcher died before logging it."""
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    cfg = compose_config(f"tracking.uri={uri}", "tracking.experiment=lost", "isolation=inline")
    run_dir = tmp_path / name
    run_dir.mkdir()
    tracking.write_pending(run_dir, uri, "lost", None)
    run_and_record(job_spec(cfg), run_dir)
    return run_dir, uri


def _active_runs(uri: str, experiment: str = "lost") -> list:
    return clients(uri, experiment)[2]


def test_a_run_whose_launcher_died_is_synced_once(tmp_path):
    run_dir, uri = _tracked_run(tmp_path)
    assert runner_main("sync", str(run_dir)).returncode == 0
    again = runner_main("sync", str(run_dir))
    assert again.stdout.strip() == f"{run_dir}: already in MLflow"
    (run,) = _active_runs(uri)
    assert run.info.status == "FINISHED"


def test_a_run_directory_without_result_is_synced_killed(tmp_path):
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    tracking.write_pending(run_dir, uri, "lost", None)
    tracking.sync(run_dir)
    (run,) = _active_runs(uri)
    assert run.info.status == "KILLED"
    assert run.data.tags["error"] == tracking.NO_RESULT


def test_artifacts_that_cannot_be_written_end_the_run_and_sync_replaces_it(tmp_path, monkeypatch, capsys):
    run_dir, uri = _tracked_run(tmp_path)
    from mlflow.tracking import MlflowClient

    real = MlflowClient.log_artifact

    def refuse(self, run_id, path, artifact_path=None):
        raise PermissionError(13, "Permission denied", path)

    monkeypatch.setattr(MlflowClient, "log_artifact", refuse)
    assert tracking.track(run_dir, uri, "lost") is None
    assert "could not log to MLflow" in capsys.readouterr().err
    (broken,) = _active_runs(uri)
    assert broken.info.status == "FAILED"  # not RUNNING
    monkeypatch.setattr(MlflowClient, "log_artifact", real)
    tracking.sync(run_dir)
    (run,) = _active_runs(uri)  # the broken upload was replaced, not doubled
    assert run.info.status == "FINISHED" and run.info.run_id != broken.info.run_id


def _killed_sweep(tmp_path: Path) -> tuple[Path, str]:
    """A sweep directory as SIGKILL of its launcher leaves it: sweep.json without a status, job 0 finished but
    not logged, job 1 with nothing but its pending tracking.json."""
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    sweep_dir = tmp_path / "sweep"
    sweep_dir.mkdir()
    note = {"sweep_dir": str(sweep_dir), "overrides": ["seed=0,1"], "launcher": "basic", "tracking": "mlflow"}
    write_sweep_file(sweep_dir, {**note, "uri": uri, "experiment": "lost", "parent_run_id": None})
    run_dir, _ = _tracked_run(tmp_path, "sweep/0")
    (sweep_dir / "1").mkdir()
    tracking.write_pending(sweep_dir / "1", uri, "lost", None)
    return sweep_dir, uri


def test_a_killed_sweep_is_synced_killed_with_every_job(tmp_path):
    sweep_dir, uri = _killed_sweep(tmp_path)
    assert cli.main(["sync", str(sweep_dir)]) == 0
    _, parents, children = clients(uri, "lost")
    assert [p.info.status for p in parents] == ["KILLED"]
    assert sorted(c.info.status for c in children) == ["FINISHED", "KILLED"]
    assert {c.data.tags["mlflow.parentRunId"] for c in children} == {parents[0].info.run_id}
    cli.main(["sync", str(sweep_dir)])
    assert len(clients(uri, "lost")[2]) == 2


def test_a_truncated_result_in_a_sweep_is_named_by_sync_and_report(tmp_path, capsys):
    sweep_dir, _ = _killed_sweep(tmp_path)
    path = sweep_dir / "0" / RESULT_FILE
    path.write_text(path.read_text()[:100])
    assert cli.main(["sync", str(sweep_dir)]) == 1
    assert f"{sweep_dir / '0'}: error: {path} cannot be read" in capsys.readouterr().err
    assert cli.main(["report", "--sweep-dir", str(sweep_dir), "--out", str(tmp_path / "report")]) == 0


def test_store_lock_serializes(tmp_path):
    uri = f"sqlite:///{tmp_path}/x.db"
    with tracking.store_lock(uri):
        assert (tmp_path / "x.db.lock").exists()


# -- slow: real processes killed, stores first used by several processes, fuzz -----------------------


def _run_py(*args: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, str(PROJECT_ROOT / "run.py"), *args],
        env=_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def _wait_for(path: Path, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while not path.exists() and time.monotonic() < deadline:
        time.sleep(0.2)


@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGKILL, signal.SIGTERM])
def test_the_worker_does_not_outlive_its_launcher(tmp_path, signum):
    run_dir, uri = tmp_path / "run", f"sqlite:///{tmp_path}/mlflow.db"
    launcher = _run_py(
        f"hydra.run.dir={run_dir}",
        f"tracking.uri={uri}",
        "tracking.experiment=lost",
        "timing.min_warmup_calls=1000000000",
        "timing.max_time_s=600",
    )
    _wait_for(run_dir / LOG_FILE)
    time.sleep(20)  # the worker is warming up (for up to 300 s)
    launcher.send_signal(signum)
    launcher.communicate(timeout=120)
    _wait_for(run_dir / RESULT_FILE, 60)
    result = Result.load(run_dir)
    assert result.status == "KILLED"
    assert result.error.startswith("terminated (SIGTERM)")
    done = runner_cli("sync", str(run_dir))
    assert done.returncode == 0, done.stdout
    runs = _active_runs(uri)
    assert [r.info.status for r in runs] == ["KILLED"]


def test_a_worker_that_ended_before_its_fork_server_said_so_is_stopped_without_a_traceback(tmp_path):
    """Ctrl-C reaches the whole group: the worker records and exits, and the launcher, told by the fork server only
    later, may signal a process that is gone. The job ends KILLED and recorded, not in a traceback."""
    worker = isolation.Worker(job_spec(compose_config("tracking=none")), tmp_path)
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    worker.process = ForkedWorker(gone.pid)
    worker.forwarder.start()
    threading.Timer(0.2, worker.process.ended, args=(-signal.SIGINT,)).start()  # the server's report, late
    result = worker.stop(stop_reason(KeyboardInterrupt()))
    assert result.status == "KILLED" and "Ctrl-C" in result.error
    assert Result.load(tmp_path).status == "KILLED"


def _new_store_runs(tmp_path: Path, n: int) -> list[subprocess.Popen]:
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    return [
        _run_py(f"hydra.run.dir={tmp_path}/r{i}", f"tracking.uri={uri}", "tracking.experiment=first", *FAST_TIMING)
        for i in range(n)
    ]


def test_a_dataset_another_run_inserted_meanwhile_is_linked_on_the_next_attempt(monkeypatch):
    """Runs logging the same inputs at once race to insert their dataset; the loser's log_inputs fails on the
    unique key (seen with 3 runs on a busy machine) and is retried, while other integrity errors are not."""
    monkeypatch.setattr(tracking.store.time, "sleep", lambda seconds: None)
    lost = "(sqlite3.IntegrityError) UNIQUE constraint failed: datasets.experiment_id, datasets.name, datasets.digest"
    attempts = []

    def log_inputs():
        attempts.append(1)
        if len(attempts) == 1:
            raise RuntimeError(lost)
        return "linked"

    assert tracking.retry_on_lock(log_inputs) == "linked" and len(attempts) == 2

    def create_run():
        raise RuntimeError("(sqlite3.IntegrityError) UNIQUE constraint failed: runs.run_uuid")

    with pytest.raises(RuntimeError, match="runs.run_uuid"):
        tracking.retry_on_lock(create_run)


@pytest.mark.slow
@pytest.mark.parametrize("trial", range(3))
def test_runs_started_together_on_a_new_store_are_all_logged(tmp_path, trial):
    processes = _new_store_runs(tmp_path, 3)
    outputs = [p.communicate(timeout=300)[0] for p in processes]
    assert [p.returncode for p in processes] == [0, 0, 0], outputs
    assert not any("could not log" in out or "INFO" in out for out in outputs), outputs
    assert len(_active_runs(f"sqlite:///{tmp_path}/mlflow.db", "first")) == 3


FIRST_USE = """
import sys
from runner import tracking
tracking.open_store(sys.argv[1])
tracking.ensure_experiment(tracking.client(sys.argv[1]), sys.argv[1], "first")
"""


@pytest.mark.slow
@pytest.mark.parametrize("trial", range(3))
def test_four_processes_open_a_new_store_together(tmp_path, trial):
    """Without the lock, 11 of 12 such processes failed here ('table ... already exists', 'Circular dependency')."""
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    command = [sys.executable, "-c", FIRST_USE, uri]
    processes = [subprocess.Popen(command, env=_env(), stderr=subprocess.PIPE, text=True) for _ in range(4)]
    errors = [p.communicate(timeout=300)[1] for p in processes]
    assert [p.returncode for p in processes] == [0] * 4, errors


@pytest.mark.slow
def test_sweeps_started_together_on_a_new_store_have_their_parents(tmp_path):
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    sweeps = [
        _run_py(
            "-m", "seed=0,1", f"hydra.sweep.dir={tmp_path}/s{i}", f"tracking.uri={uri}", "tracking.experiment=first"
        )
        for i in range(2)
    ]
    outputs = [p.communicate(timeout=300)[0] for p in sweeps]
    assert [p.returncode for p in sweeps] == [0, 0], outputs
    _, parents, children = clients(uri, "first")
    assert len(parents) == 2 and len(children) == 4
    assert {c.data.tags.get("mlflow.parentRunId") for c in children} == {p.info.run_id for p in parents}


FUZZ_KEYS = [
    "batch_size",
    "seed",
    "dtype",
    "backend",
    "model",
    "mode",
    "task",
    "device",
    "data",
    "isolation",
    "tracking",
    "tracking.uri",
    "tracking.experiment",
    "model.n",
    "model.size",
    "model.hidden",
    "data.path",
    "timing.warmup_s",
    "timing.max_time_s",
    "timing.min_block_s",
    "timing.min_repeats",
    "timing.min_warmup_calls",
    "timing.target_rel_iqr",
]
FUZZ_VALUES = [
    "",
    "0",
    "-1",
    "1e308",
    "nan",
    "inf",
    "-inf",
    "abc",
    "3.5",
    "true",
    "null",
    "ünïcødé",
    "日本語",
    "../../../../tmp/x",
    "/etc/passwd",
    "a/b",
    "'quoted'",
    "numpy",
    "torch",
    "cuda",
    "matmul",
    "sigmoid",
    "function",
    "jacobian",
    "float16",
    "bfloat16",
    "image",
    "x" * 300,
]


@pytest.mark.slow
def test_fuzz_no_traceback_no_hang(tmp_path):
    """Seeded random override sets: each ends within its timeout with exit 0, 1 or 2 and no traceback."""
    import random

    rng = random.Random(11)
    for trial in range(30):
        overrides = [f"{key}={rng.choice(FUZZ_VALUES)}" for key in rng.sample(FUZZ_KEYS, rng.randint(1, 3))]
        args = [
            *overrides,
            f"hydra.run.dir={tmp_path}/run{trial}",
            "tracking=none" if "tracking" not in str(overrides) else f"hydra.sweep.dir={tmp_path}/s{trial}",
            "timing.max_time_s=0.5" if "max_time_s" not in str(overrides) else "seed=0",
            *([] if "tracking.uri" in str(overrides) else [f"tracking.uri=sqlite:///{tmp_path}/t{trial}.db"]),
        ]
        done = run_cli(*args, cwd=tmp_path, timeout=240)  # a relative path the fuzz gives lands in tmp_path too
        output = done.stdout + done.stderr
        assert done.returncode in (0, 1, 2), (args, output)
        assert "Traceback" not in output, (args, output)
        if done.returncode == 2:  # refused before running: one line (a shared venv may add plugin warnings above)
            errors = [line for line in done.stderr.splitlines() if line.startswith("error")]
            assert len(errors) == 1 and done.stderr.strip().endswith(errors[0]), (args, done.stderr)


def test_a_store_killed_while_it_is_created_leaves_no_store_and_opens_afresh(tmp_path):
    """SIGKILL while MLflow creates and migrates the tables of a new store (the file beside it exists):
    no store is left at the path, and the next open creates a complete one."""
    db = tmp_path / "new.db"
    opener = subprocess.Popen(
        [sys.executable, "-c", f"from runner import tracking; tracking.open_store('sqlite:///{db}')"], env=_env()
    )
    deadline = time.monotonic() + 120
    while not list(tmp_path.glob(".new.db.*.creating")) and opener.poll() is None and time.monotonic() < deadline:
        time.sleep(0.001)
    opener.kill()
    opener.wait()
    assert list(tmp_path.glob(".new.db.*.creating")), "the creation ended before it could be killed"
    assert not db.exists()
    tracking.open_store(f"sqlite:///{db}")
    assert db.exists() and not list(tmp_path.glob(".new.db.*"))  # the killed creation's file and journal
    assert tracking.client(f"sqlite:///{db}").search_experiments()  # complete: MLflow's Default experiment


def test_a_half_migrated_store_is_one_line_saying_what_to_do(tmp_path, monkeypatch):
    def half_migrated(uri):
        raise RuntimeError("(sqlite3.OperationalError) table _alembic_tmp_experiments already exists")

    from runner.tracking import store

    monkeypatch.setattr(store, "client", half_migrated)
    (tmp_path / "old.db").write_bytes(b"")
    with pytest.raises(ConfigError, match="left half-migrated .* move the file aside"):
        tracking.open_store(f"sqlite:///{tmp_path}/old.db")


# Issue 79's inputs, each kind with realistic mistakes and values that work ({tmp}: the test's folder; {ck}: a
# checkpoint folder whose config.json CHECKPOINTS below writes, by name)
ISSUE_79 = {
    "prompt lengths": (["model=llama", "task=generate", "task.new_tokens=2"],
                       [f"task.prompt_lengths={v}" for v in
                        ("'123'", "5", "[1.5,4]", "[true,4]", "[]", "[0,4]", "[99]", "[4,3]", "null", "abc")]),
    "blocks": (["-m", "hydra/launcher=slurm"],
               [f"hydra.launcher.blocks={v}" for v in ("-1", "0", "2.5", "abc", "1000000000", "true", "[1]")]),
    "control": (["model=matmul", "task=inference", "model.n=128", "threads=1"],
                ["control=matmul", "control=", "control=nope", "control.overrides=[]",
                 "-m backend=numpy control=matmul", "-m backend=numpy,numpy control=matmul"]),
    "output paths": ([], ["hydra.run.dir=/proc/runner-x", "hydra.run.dir={tmp}/a-file/run", "hydra.run.dir=",
                          f"hydra.run.dir={{tmp}}/{'y' * 300}", f"tracking.uri=sqlite:///{{tmp}}/{'y' * 300}.db",
                          "-m hydra.sweep.dir=/proc/runner-x", "hydra.run.dir={tmp}/fine"]),
    "checkpoint configs": (["model=llama", "task=generate", "task.new_tokens=2"],
                           ["model.weights={ck}/" + name for name in
                            ("types", "zero", "nan", "folder", "layers", "family", "rope", "layer_types")]),
}  # fmt: skip
CHECKPOINTS = {
    "types": {"hidden_size": "64"},
    "zero": {"num_key_value_heads": 0},
    "nan": {"rms_norm_eps": float("nan")},
    "layers": {"num_hidden_layers": "2"},
    "family": {"model_type": 5},
    "rope": {"rope_scaling": "x"},
    "layer_types": {"layer_types": 3},
}


@pytest.mark.heavy
def test_a_fuzz_of_issue_79s_inputs_ends_in_a_run_or_one_line(tmp_path):
    """Seeded command lines of issue 79's kinds (prompt lengths, launcher blocks, the control, output paths,
    checkpoint configs), one or two kinds each: each exits 0, or non-zero with one line (exit 2: the only line of the
    runner's on stderr), never a traceback; a refusal writes no run folder and no store."""
    import json
    import random

    (tmp_path / "a-file").write_text("x\n")
    base = {"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4}
    for name, changed in CHECKPOINTS.items():
        (tmp_path / "ck" / name).mkdir(parents=True)
        (tmp_path / "ck" / name / "config.json").write_text(json.dumps({**base, **changed}))
    (tmp_path / "ck" / "folder" / "config.json").mkdir(parents=True)
    rng = random.Random(79)
    wrong = []
    for trial in range(24):
        kinds = rng.sample(sorted(ISSUE_79), rng.choice((1, 1, 2)))
        args = [arg for kind in kinds for arg in ISSUE_79[kind][0]]
        for kind in kinds:
            args += rng.choice(ISSUE_79[kind][1]).format(tmp=tmp_path, ck=tmp_path / "ck").split(" ")
        if "-m" in args:
            args = ["-m", *(a for a in args if a != "-m")]
        given = {a.split("=", 1)[0] for a in args}
        args += [f"{key}={value}" for key, value in (("hydra.run.dir", f"{tmp_path}/run{trial}"),
                 ("hydra.sweep.dir", f"{tmp_path}/sweep{trial}"), ("tracking.uri", f"sqlite:///{tmp_path}/s{trial}.db"),
                 ("timing.max_time_s", "0.2"), ("timing.rounds", "2")) if key not in given]  # fmt: skip
        done = run_cli(*dict.fromkeys(args), timeout=300)
        output = done.stdout + done.stderr
        said = [line for line in done.stderr.splitlines() if line.startswith("error")]
        one_line = len(said) == 1 and done.stderr.strip().endswith(said[0])
        nothing = not any((tmp_path / f"{name}{trial}").exists() for name in ("run", "sweep", "s"))
        if "Traceback" in output or (done.returncode and not one_line) or (done.returncode == 2 and not nothing):
            wrong.append((args, done.returncode, done.stderr[-800:]))
    assert not wrong, "\n".join(map(str, wrong))

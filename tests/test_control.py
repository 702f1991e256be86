"""A control case (`control=matmul`): timed in a sweep's rounds beside its jobs, it lets a history divide each run by
the control of its sweep, so that drift of the whole machine cancels and only the case's own step is called."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from helpers import FAST_TIMING, mlflow_runs, runner_main, sweep_cli

from runner import identity
from runner.history.steps import Label
from runner.launch import control
from runner.record import naming
from runner.record.result import Result, Status
from runner.record.sweep_file import note_control, write_sweep_file
from runner.tracking.upload import log_to_mlflow

CASE = {
    "backend": {"name": "torch"},
    "model": {"name": "mlp", "hidden": 64},
    "task": {"name": "gradients"},
    "mode": {"name": "eager"},
    "device": {"name": "cpu"},
    "dtype": "float32",
    "batch_size": 32,
    "seed": 0,
    "threads": None,
    "timing": {"max_time_s": 1.0},
}
CONTROL = {**CASE, "backend": {"name": "numpy"}, "model": {"name": "matmul", "n": 128}, "task": {"name": "inference"}}
MACHINE = {"hostname": "ci-1", "cpu": "AMD EPYC 7B13", "cpu_count": 2, "memory_gib": 24, "framework": "torch"}


def test_the_control_job_is_the_first_job_less_what_the_control_sets():
    from omegaconf import OmegaConf

    sweep = OmegaConf.create(
        {"control": {"name": "matmul", "overrides": ["backend=numpy", "model=matmul", "threads=1"]}}
    )
    first = [
        "backend=torch",
        "model=mlp",
        "model.hidden=64",
        "+model.extra=1",
        "seed=1",
        "control=matmul",
        "dtype=float64",
    ]
    assert control.job_overrides(sweep, first) == [
        "seed=1",
        "dtype=float64",
        "backend=numpy",
        "model=matmul",
        "threads=1",
    ]
    assert control.job_overrides(OmegaConf.create({"control": None}), first) is None


def _case(config: dict) -> identity.Key:
    return identity.of_config(config, (), MACHINE, naming.run_name(config)).case


def _sweeps(tmp_path, case_s: list[float], control_s: list[float]) -> tuple[str, list[str]]:
    """One sweep per pair: the case's run (job 0) and its control's (job 1), logged under a parent of the sweep's."""
    from helpers import made_store

    uri, ids = made_store(tmp_path), []
    for i, (value, reference) in enumerate(zip(case_s, control_s, strict=True)):
        sweep_dir = tmp_path / f"sweep{i:02d}"
        sweep_dir.mkdir()
        write_sweep_file(sweep_dir, {"overrides": []})
        found = _case(CONTROL)
        note_control(sweep_dir, 1, "1", found.key, found.name)
        for job, (config, seconds) in enumerate(((CASE, value), (CONTROL, reference))):
            run_dir = sweep_dir / str(job)
            run_dir.mkdir()
            started = 1.79e9 + 3600 * i + job
            metrics = {"time_typical_s": seconds, "time_median_s": seconds, "time_iqr_s": 0.0, "first_call_s": seconds}
            Result(Status.FINISHED, config, metrics, MACHINE, started=started, ended=started + 1).save(run_dir)
            run_id = log_to_mlflow(run_dir, uri, "control", parent_run_id=f"{i:032x}")
            ids += [run_id] if job == 0 else []
    return uri, ids


def test_a_history_relative_to_its_control_calls_the_case_s_step_and_not_the_machine_s(tmp_path):
    """12 sweeps: the whole machine 15% slower in sweeps 4-6 (the case and its control alike), the case's own work
    10% heavier from sweep 9 on. Fitted relative to its control, the case has one step, at sweep 9; the control's
    own series shows the machine's, and --fail-on regression fails on the case's step alone."""
    rng = np.random.default_rng(2)
    machine = [1.15 if 3 <= i <= 5 else 1.0 for i in range(12)]
    noise = [math.exp(rng.normal(0, 0.005)) for _ in range(12)]
    case_s = [1e-4 * m * n * (1.1 if i >= 8 else 1.0) for i, (m, n) in enumerate(zip(machine, noise, strict=True))]
    control_s = [2e-5 * m * math.exp(rng.normal(0, 0.005)) for m in machine]
    uri, ids = _sweeps(tmp_path, case_s, control_s)
    result = runner_main("history", "--tracking-uri", uri, "--json", "--fail-on", "regression")
    found = {h["case_name"]: h for h in json.loads(result.stdout)}
    case = found[_case(CASE).name]
    assert case["fitted"] == f"relative to {_case(CONTROL).name}"
    assert [(s["index"], s["label"], s["run_id"]) for s in case["steps"]] == [(8, "regression", ids[8])]
    # the times themselves: the machine's 15% for three sweeps widens their noise, and the case's own step is lost
    assert (8, "regression") not in [(s["index"], s["label"]) for s in case["raw_steps"]]
    assert found[_case(CONTROL).name]["fitted"] == "times"
    assert result.returncode == 1 and result.stderr.count("failing: ") == 1, result.stderr
    assert f"failing: {_case(CASE).name}: regression" in result.stderr
    printed = runner_main("history", "--tracking-uri", uri).stdout
    assert f"fitted relative to its control, {_case(CONTROL).name}, timed in the same rounds" in printed
    assert "the control of the cases timed beside it" in printed


def test_a_sweeps_closing_lines_judge_its_case_relative_to_its_control_as_runner_history_does(tmp_path):
    """12 sweeps; in the newest the whole machine was 15% slower (the case and its control alike), and in a second
    store the case's own work was 10% heavier there too. Before: a sweep's closing lines fitted the case's raw times
    ('history: CASE: suspicious: 1.15x ...' for the machine's slowdown, 1.26x for the case's own 10%) and the
    control's own series, the machine's, while `runner history` fitted the case relative to its control (no step;
    1.10x). Now the closing lines say what `runner history` says: nothing of the machine, the case's own step as it
    is, relative to its control, in so many words."""
    from runner.history.store import regressed_here

    rng = np.random.default_rng(5)
    machine = [1.15 if i == 11 else 1.0 for i in range(12)]
    noise = [(math.exp(rng.normal(0, 0.005)), math.exp(rng.normal(0, 0.005))) for _ in range(12)]
    for heavier in (1.0, 1.1):
        folder = tmp_path / f"heavier{heavier}"
        case_s = [1e-4 * machine[i] * a * (heavier if i == 11 else 1.0) for i, (a, _) in enumerate(noise)]
        uri, ids = _sweeps(folder, case_s, [2e-5 * machine[i] * b for i, (_, b) in enumerate(noise)])
        closing = regressed_here(uri, [folder / "sweep11" / str(job) for job in range(2)])
        result = runner_main("history", "--tracking-uri", uri, "--fail-on", "regression,suspicious")
        assert f"fitted relative to its control, {_case(CONTROL).name}" in result.stdout, result.stdout
        said = [line.removeprefix("failing: ") for line in result.stderr.splitlines() if line.startswith("failing: ")]
        where = f" (runner history --case {_case(CASE).key} --machine {identity.machine(MACHINE).key})"
        assert [line.removeprefix("history: ").removesuffix(where) for line in closing] == said, (closing, said)
        assert result.returncode == (heavier > 1), result.stderr
        assert not said or (said[0].startswith(f"{_case(CASE).name}: suspicious: 1.1") and ids[11][:12] in said[0])
        assert all("] relative to its control from run " in line for line in said)  # a line alone says what it fits


def test_a_sweep_with_a_control_times_it_in_the_same_rounds_and_its_jobs_name_it(tmp_path):
    result = sweep_cli(tmp_path, "backend=numpy,torch", "model=mlp", "control=matmul", *FAST_TIMING)
    assert result.returncode == 0, result.stderr[-3000:]
    info = json.loads((tmp_path / "sweep" / "sweep.json").read_text())
    assert info["control"]["job"] == 2 and info["control"]["case_name"].startswith("numpy-matmul-inference")
    control_record = json.loads((tmp_path / "sweep" / "2" / "result.json").read_text())
    assert (
        control_record["status"] == "FINISHED" and control_record["identity"]["case"]["key"] == info["control"]["case"]
    )
    parents, children = mlflow_runs(tmp_path)
    tagged = {c.data.tags["case_name"]: c.data.tags.get("control_case") for c in children}
    assert len(tagged) == 3 and sorted(v for v in tagged.values() if v) == [info["control"]["case"]] * 2
    assert tagged[info["control"]["case_name"]] is None  # the control itself names no control
    control_run = next(c for c in children if c.data.tags["case_name"] == info["control"]["case_name"])
    assert control_run.data.tags["is_control"] == "true"
    # the answer as summary.md opens on it, whatever a busy machine made of it ('not enough samples for an order' too)
    answer = (tmp_path / "sweep" / "summary.md").read_text().split("**")[1]
    assert answer in result.stdout and "matmul" not in answer, answer  # measured beside, not compared


def test_a_load_the_control_cannot_cancel_fails_no_gate_where_its_runs_were_measured_busy():
    """Nights 8-10 under a full load (both cores spun): the case's 20 ms calls take 1.9x as long (every block is
    preempted), the control's 43 us ones do not (a turn's fastest block steps round the load), as measured here
    (BENCHMARKS.md, *History: the CI gate*); the runs recorded 2 other runnable threads. Read after each night as a
    nightly gate reads it (--new-within 3), relative to the control, no step fails the gate: a step beside runs
    measured busy is 'busy machine'. The same times without the load recorded fail it."""
    from runner.history import build as history
    from runner.history import describe
    from runner.history.gate import failing, recent

    rng = np.random.default_rng(4)
    loaded = range(8, 11)

    def store(nights: int, recorded: bool) -> list:
        rows = []
        for i in range(nights):
            slow, busy = (1.9, 2.0) if i in loaded else (1.0, 0.0)
            case_s, control_s = 20e-3 * slow * math.exp(rng.normal(0, 0.01)), 43e-6 * math.exp(rng.normal(0, 0.01))
            entry = history.Entry(f"n{i}", 1.79e9 + 86_400 * i, case_s, control_s=control_s, busy=busy * recorded)
            rows.append(("case", "matmul n=1000", "m", "machine", entry))
        return rows

    def gate(nights: int, recorded: bool) -> list[str]:
        histories = history.build(store(nights, recorded), controls={"case": "control"}, fdr=None)
        return failing(recent(histories, 3), {"regression", "improvement"})

    assert all(gate(nights, recorded=True) == [] for nights in range(9, 15))
    loaded_now = history.build(store(10, recorded=True), controls={"case": "control"}, fdr=None)[0]
    assert [(s.index, s.label) for s in loaded_now.steps] == [(8, Label.BUSY)]
    said = describe.describe_step(loaded_now, loaded_now.steps[0])
    assert said.startswith("busy machine: 1.9") and said.endswith("beside runs measured busy: load alone makes as much")
    assert any(gate(nights, recorded=False) for nights in range(9, 15))


@pytest.mark.heavy  # a second real sweep with a control; the default set times one
def test_a_sweeps_own_job_that_does_the_controls_work_is_not_the_control(tmp_path):
    """Issue 79: `-m backend=numpy,torch model=matmul ... control=matmul` tagged the sweep's own numpy job
    is_control=true too (the control was recognised by its case). Only the job the control group adds is."""
    result = sweep_cli(tmp_path, "backend=numpy,torch", "model=matmul", "model.n=128", "task=inference", "threads=1",
                       "control=matmul", *FAST_TIMING)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    said = [line for line in result.stderr.splitlines() if "does the control's own work" in line]
    assert len(said) == 1 and "job #0" in said[0] and "job #2" in said[0], result.stderr[-2000:]
    _, children = mlflow_runs(tmp_path)
    marked = {c.data.tags["mlflow.runName"]: c.data.tags.get("is_control", "") for c in children}
    assert sorted(marked.values()) == ["", "", "true"], marked
    assert [name for name, flag in marked.items() if flag] == [n for n in marked if n.endswith("#2")], marked

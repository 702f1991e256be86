"""A history fitted relative to its control (`control=matmul`, docs/history.md) when one sweep's control gave no
time: killed while timing, as a control was on one night. That sweep costs the fit relative to the control its own
point, not the whole history, and every output a person reads says so, naming the sweep, its run and why."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
from helpers import made_store, runner_main
from test_control import CASE, CONTROL, MACHINE, _case

from runner.record.result import Result, Status
from runner.record.sweep_file import note_control, write_sweep_file
from runner.tracking.upload import log_to_mlflow

KILLED = 5  # the sweep whose control was killed: one of the three the whole machine ran 15% slower


def _parent(sweep: int) -> str:
    """A sweep's MLflow parent run id, told apart by its first 12 characters (as a history names it)."""
    return f"{sweep:02d}" + "e" * 30


def _sweeps(tmp_path: Path) -> tuple[str, list[str]]:
    """12 sweeps of the case and its control, the machine 15% slower in sweeps 3-5, the case's work 10% heavier from
    sweep 8; sweep 5's control terminated (SIGTERM) while timing, recorded KILLED with what its 34 rounds measured.
    Returns the store and the case's run ids."""
    uri, ids = made_store(tmp_path), []
    rng = np.random.default_rng(2)
    for i in range(12):
        machine = 1.15 if 3 <= i <= 5 else 1.0
        case_s = 1e-4 * machine * math.exp(rng.normal(0, 0.005)) * (1.1 if i >= 8 else 1.0)
        control_s = 2e-5 * machine * math.exp(rng.normal(0, 0.005))
        sweep_dir = tmp_path / f"sweep{i:02d}"
        sweep_dir.mkdir()
        write_sweep_file(sweep_dir, {"overrides": []})
        found = _case(CONTROL)
        note_control(sweep_dir, 1, "1", found.key, found.name)
        for job, (config, seconds) in enumerate(((CASE, case_s), (CONTROL, control_s))):
            run_dir = sweep_dir / str(job)
            run_dir.mkdir()
            started = 1.79e9 + 3600 * i + job
            metrics = {"time_typical_s": seconds, "time_median_s": seconds, "time_iqr_s": 0.0,
                       "first_call_s": seconds, "n_rounds": 40}  # fmt: skip
            status, error = Status.FINISHED, None
            if job == 1 and i == KILLED:
                status, error, metrics["n_rounds"] = Status.KILLED, "terminated (SIGTERM) while timing", 34
            Result(status, config, metrics, MACHINE, error=error, started=started, ended=started + 1).save(run_dir)
            run_id = log_to_mlflow(run_dir, uri, "control", parent_run_id=_parent(i))
            ids += [run_id] if job == 0 else []
    return uri, ids


def test_a_killed_control_costs_the_relative_fit_its_sweeps_point_and_every_output_says_so(tmp_path):
    """Before: the killed control left its sweep's run without a control's time, so the whole history fell back to
    its raw times, where the machine's 15% for three sweeps hid the case's own 10% step; only the page's text said
    'no control was timed beside every run'. Now the case is fitted relative to its control over the other 11
    sweeps, finds the step at sweep 8, and each output names the sweep, the run left out and why."""
    uri, ids = _sweeps(tmp_path)
    said = (
        f"control killed in sweep {_parent(KILLED)[:12]} (terminated (SIGTERM) while timing): run {ids[KILLED][:12]} "
        "left out of the fit relative to its control"
    )
    result = runner_main("history", "--tracking-uri", uri, "--json", "--fail-on", "regression")
    assert result.returncode == 1, result.stderr[-3000:]
    case = {c["case_name"]: c for c in json.loads(result.stdout)}[_case(CASE).name]
    assert case["fitted"] == f"relative to {_case(CONTROL).name}"
    assert [(s["index"], s["label"], s["run_id"]) for s in case["steps"]] == [(8, "regression", ids[8])]
    assert case["control_notes"] == [said]
    lost = [r["control_lost"] for r in case["runs"]]
    assert lost == [""] * KILLED + [said.split(":")[0]] + [""] * (11 - KILLED)
    printed = runner_main("history", "--tracking-uri", uri)
    assert f"\n  {said}\n" in printed.stdout, printed.stdout
    assert f"fitted relative to its control, {_case(CONTROL).name}" in printed.stdout
    comment = runner_main("history", "--tracking-uri", uri, "--markdown").stdout
    assert f"- {_case(CASE).name.replace('_', chr(92) + '_')}: {said}\n" in comment, comment
    assert runner_main("history", "--tracking-uri", uri, "--html", str(tmp_path / "pages")).returncode == 0
    index = (tmp_path / "pages" / "index.html").read_text()
    assert f"fitted relative to its control {_case(CONTROL).name}; {said};" in index
    (page,) = (tmp_path / "pages").glob(f"{_case(CASE).key}-*.html")
    assert f"Fitted relative to the control {_case(CONTROL).name}" in page.read_text()
    assert f"{said[0].upper()}{said[1:]}." in page.read_text()
    folders = runner_main("history", *(str(tmp_path / f"sweep{i:02d}") for i in range(12)))  # read from its folders
    assert folders.returncode == 0 and "regression: 1.1" in folders.stdout, folders.stderr[-3000:]
    assert (
        f"  control killed in sweep {tmp_path.name}/sweep{KILLED:02d} (terminated (SIGTERM) while timing): run "
        f"sweep{KILLED:02d}/0 left out of the fit relative to its control\n"
    ) in folders.stdout


def test_a_case_whose_control_gave_a_time_in_too_few_sweeps_is_fitted_on_its_times_and_says_why():
    """Its control killed in 7 of 12 sweeps: a ratio in 5 sweeps is no series to gate on, so the times are fitted, and
    the first line says so, each sweep's after it."""
    from runner.history import build as history
    from runner.history.describe import control_notes

    def entry(i: int) -> history.Entry:
        lost = f"control killed in sweep s{i} (terminated (SIGTERM) while timing)" if i >= 5 else ""
        return history.Entry(f"run{i}", 1.79e9 + 3600 * i, 1e-4, control_s=math.nan if lost else 2e-5,
                             sweep=f"s{i}", control_lost=lost)  # fmt: skip

    (found,) = history.build([("c", "case", "m", "box", entry(i)) for i in range(12)], {"c": "matmul"})
    assert not found.relative
    notes = control_notes(found)
    assert notes[0] == "fitted on its times, not relative to its control: its control gave a time in 5 of its 12 sweeps"
    assert notes[1:] == [
        f"control killed in sweep s{i} (terminated (SIGTERM) while timing): run run{i} has no ratio to its control"
        for i in range(5, 12)
    ]


def test_the_plot_holds_the_place_of_a_run_whose_control_gave_no_time():
    """Before: fitted relative to its control, a run whose control gave no time had no ratio and the plot showed
    nothing where it was: a person counting points found one missing and no word why. Now a dotted line holds its
    place, and the legend says what it is."""
    from runner.history import build as history
    from runner.history.page import figure

    def entry(i: int) -> history.Entry:
        lost = f"control killed in sweep s{i} (terminated (SIGTERM) while timing)" if i == KILLED else ""
        return history.Entry(f"run{i}", 1.79e9 + 3600 * i, 1e-4, control_s=math.nan if lost else 2e-5,
                             sweep=f"s{i}", control_lost=lost)  # fmt: skip

    (found,) = history.build([("c", "case", "m", "box", entry(i)) for i in range(12)], {"c": "matmul"})
    assert found.relative
    (ax,) = figure(found).axes
    dotted = [line.get_xdata()[0] for line in ax.get_lines() if line.get_linestyle() == ":"]
    assert dotted == [KILLED]
    assert "its control gave no time: no ratio" in [text.get_text() for text in ax.get_legend().get_texts()]

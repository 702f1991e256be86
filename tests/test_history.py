"""`runner history`: runs carry their case and machine as tags, a case's series is found by a filtered search, and a
known slowdown is found at the run it started, with no alarm elsewhere and none at a marked known change."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import numpy as np
import pytest
from helpers import made_store, runner_cli, runner_main

from runner import identity, tracking
from runner.history import build as history
from runner.history import describe, gate
from runner.history.series import apart_interval
from runner.identity import Key
from runner.record import naming
from runner.record.result import Result, Status
from runner.tracking.upload import log_to_mlflow

CONFIG = {
    "backend": {"name": "numpy"},
    "model": {"name": "mlp", "hidden": 64},
    "task": {"name": "gradients"},
    "mode": {"name": "eager"},
    "device": {"name": "cpu"},
    "dtype": "float32",
    "batch_size": 32,
    "seed": 0,
    "threads": None,
    "timing": {"max_time_s": 1.0},
    "tracking": {"experiment": "history"},
}
MACHINE = {
    "hostname": "box",
    "cpu": "AMD EPYC 7B13",
    "cpu_count": 2,
    "memory_gib": 24,
    "python": "3.11.7",
    "framework": "numpy",
}


def _case(config: dict) -> Key:
    return identity.of_config(config, (), MACHINE, naming.run_name(config)).case


def test_a_case_is_the_work_and_its_setting_not_the_seed_nor_the_budget():
    key = _case(CONFIG)
    assert _case({**CONFIG, "seed": 7, "timing": {"max_time_s": 9.0}}) == key
    assert _case({**CONFIG, "batch_size": 64}).key != key.key
    assert _case({**CONFIG, "backend": {"name": "torch"}}).key != key.key
    assert key.name == "numpy-mlp-gradients-eager-cpu-float32 batch_size=32"


def test_a_point_gets_the_interval_of_runs_made_apart():
    low, high = apart_interval(1e-4)
    assert low < 1e-4 < high and math.log(high / 1e-4) == pytest.approx(1.96 * math.sqrt(0.03**2 / 2 + 0.012**2), 0.01)
    assert apart_interval(1e-4, processes=4)[1] < high  # more processes average their offsets


def _store(tmp_path, seconds: list[float]) -> tuple[str, list[str]]:
    """A store holding one run per value, an hour apart, as single runs of the same case record themselves."""
    uri = made_store(tmp_path)
    ids = []
    for i, value in enumerate(seconds):
        run_dir = tmp_path / f"run{i:02d}"
        run_dir.mkdir()
        started = 1.79e9 + 3600 * i
        metrics = {
            "time_typical_s": value,
            "time_median_s": value,
            "time_iqr_s": 0.0,
            "first_call_s": value,
            "n_processes": 1,
        }
        result = Result(Status.FINISHED, CONFIG, metrics, MACHINE, started=started, ended=started + 5)
        result.save(run_dir)
        ids.append(log_to_mlflow(run_dir, uri, "history"))
    return uri, ids


@pytest.fixture(scope="module")
def slowed(tmp_path_factory):
    """14 runs of one case, the work 10% slower from the 8th on (index 7), each with the noise of runs made apart."""
    rng = np.random.default_rng(3)
    values = [100e-6 * (1.1 if i >= 7 else 1.0) * math.exp(rng.normal(0, 0.01)) for i in range(14)]
    return _store(tmp_path_factory.mktemp("history"), values)


def test_every_run_is_tagged_with_its_case_and_machine(slowed):
    uri, ids = slowed
    rows = tracking.history_runs(uri, "history")
    assert len(rows) == 14 and {r.tags["case"] for r in rows} == {_case(CONFIG).key}
    assert {r.tags["machine_name"] for r in rows} == {"AMD EPYC 7B13 · 2 cores · 24 GiB"}
    assert {r.identity.host for r in rows} == {"box"}
    assert len(tracking.history_runs(uri, None, case="0" * 16)) == 0  # the filter, not a scan, picks the case


def test_history_finds_the_slowdown_at_the_run_it_started(slowed, tmp_path):
    uri, ids = slowed
    result = runner_main("history", "--tracking-uri", uri, "--json", "--html", str(tmp_path / "page"))
    assert result.returncode == 0, result.stderr[-3000:]
    (case,) = json.loads(result.stdout)
    assert [(s["index"], s["label"], s["run_id"]) for s in case["steps"]] == [(7, "regression", ids[7])]
    step = case["steps"][0]
    assert step["low"] < 1.1 < step["high"] and step["ratio"] == pytest.approx(1.1, rel=0.03)
    assert (tmp_path / "page" / "index.html").read_text().count("regression") >= 1
    assert len(list((tmp_path / "page").glob("*.png"))) == 1
    (page,) = [p for p in (tmp_path / "page").glob("*.html") if p.name != "index.html"]
    experiment = tracking.search.client(uri).get_run(ids[7]).info.experiment_id
    link = f"http://127.0.0.1:5000/#/experiments/{experiment}/runs/{ids[7]}?workflowType=machine_learning"
    assert f"<a href='{link}'>{ids[7]}</a>" in page.read_text()  # its MLflow page, in the model-training view
    assert "Fitted on the typical times themselves" in page.read_text()  # what the steps were found in
    mlflow = tracking.search.client(uri)
    assert "history.verdict" not in mlflow.get_run(ids[-1]).data.tags  # a read writes nothing (issue 74)
    assert not mlflow.list_artifacts(ids[-1], "history")
    recorded = runner_main("history", "--tracking-uri", uri, "--record", "--html", str(tmp_path / "page"))
    assert recorded.returncode == 0, recorded.stderr[-3000:]
    assert mlflow.get_run(ids[-1]).data.tags["history.verdict"].startswith("regression: 1.1")
    logged = {a.path for a in mlflow.list_artifacts(ids[-1], "history")}
    assert logged == {f"history/{page.name}", f"history/{page.with_suffix('.png').name}"}  # found from the runs
    shown = Path(mlflow.download_artifacts(ids[-1], f"history/{page.name}", str(tmp_path))).read_text()
    assert "<img src='data:image/png;base64," in shown and "<a " not in shown  # whole in MLflow's artifact viewer


def test_a_recorded_page_is_two_clicks_from_its_sweeps_parent_run(tmp_path):
    """Issue 77: the page was logged to each case's newest run only, three clicks from the sweep's page (a child
    run, its Artifacts, history/). It is also at the top of the newest run's parent: Artifacts, then the file."""
    uri = made_store(tmp_path)
    mlflow = tracking.search.client(uri)
    experiment = mlflow.get_experiment(mlflow.create_experiment("history", str(tmp_path / "artifacts")))
    parents = []
    for i in range(4):
        parent = mlflow.create_run(experiment.experiment_id).info.run_id
        parents.append(parent)
        _folder_run(tmp_path / "runs", f"{i}", 1.79e9 + 3600 * i)
        log_to_mlflow(tmp_path / "runs" / f"{i}", uri, "history", parent_run_id=parent)
    recorded = runner_main("history", "--tracking-uri", uri, "--record", "--html", str(tmp_path / "page"))
    assert recorded.returncode == 0, recorded.stderr[-3000:]
    (page,) = [p for p in (tmp_path / "page").glob("*.html") if p.name != "index.html"]
    assert [a.path for a in mlflow.list_artifacts(parents[-1])] == [f"history-{page.name}"]
    assert not mlflow.list_artifacts(parents[0])  # an older sweep's parent keeps what it had
    shown = Path(mlflow.download_artifacts(parents[-1], f"history-{page.name}", str(tmp_path))).read_text()
    assert "<img src='data:image/png;base64," in shown and "<a " not in shown


def test_a_sweep_that_measured_the_slowdown_says_so_in_its_closing_lines(slowed):
    from runner.history.store import regressed_here

    uri, ids = slowed
    store = Path(uri.removeprefix("sqlite:///")).parent
    (line,) = regressed_here(uri, sorted(store.glob("run*"))[7:])  # the runs after the step, as a sweep's jobs
    assert line.startswith("history: numpy-mlp-gradients") and f"run {ids[7][:12]}" in line and "regression" in line
    assert regressed_here(uri, sorted(store.glob("run*"))[:7]) == []  # runs before the step: nothing to say


def test_fail_on_regression_exits_1_for_ci(slowed):
    uri, _ = slowed
    result = runner_main("history", "--tracking-uri", uri, "--fail-on", "regression")
    assert result.returncode == 1 and "failing: numpy-mlp-gradients" in result.stderr
    refused = runner_main("history", "--tracking-uri", uri, "--fail-on", "slower")
    assert refused.returncode == 2 and refused.stderr.startswith("error: --fail-on slower: slower is no label")


def test_a_marked_known_change_raises_no_alert(tmp_path):
    rng = np.random.default_rng(5)
    values = [100e-6 * (1.1 if i >= 7 else 1.0) * math.exp(rng.normal(0, 0.01)) for i in range(14)]
    uri, ids = _store(tmp_path, values)
    marked = runner_main("history", "--tracking-uri", uri, "--mark", ids[7], "--why", "new machine")
    assert marked.returncode == 0, marked.stderr
    result = runner_main("history", "--tracking-uri", uri, "--json", "--fail-on", "regression")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)[0]["steps"] == []


@pytest.mark.heavy  # five fresh processes that import MLflow; the tests above cover each option in-process or once
def test_the_history_page_commands_run_as_printed(slowed, tmp_path, monkeypatch):
    """docs/history.md's `runner history` commands, against this store instead of the user's (the page's --mark
    takes the newest run's id; the command without a store reads MLFLOW_TRACKING_URI's): each ends as the page says
    (exit 1 only with --fail-on, as a regression is here, but for --new-within: the step is not among the newest)."""
    from runner.config import PROJECT_ROOT

    uri, ids = slowed
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    page = (PROJECT_ROOT / "docs" / "history.md").read_text()
    lines = [line.split("  #")[0] for line in page.splitlines() if line.startswith(".venv/bin/runner history")]
    commands = [line.split()[1:] for line in lines]
    assert len(commands) >= 5
    for args in commands:
        args = [a.replace("sqlite:///outputs/mlflow.db", uri).replace("RUN_ID", ids[-1]) for a in args]
        args = [str(tmp_path / a) if a == "history/" else a for a in args]
        if "--why" in args:  # the page quotes the reason
            at = args.index("--why")
            args = [*args[: at + 1], " ".join(args[at + 1 :]).strip('"')]
        result = runner_cli(*args)
        failing = "--fail-on" in args and "--new-within" not in args  # its step is 7 runs old: no new step
        assert result.returncode == (1 if failing else 0), (args, result.stderr[-2000:])


def test_a_short_history_says_it_is_too_short_to_tell(tmp_path):
    uri, _ = _store(tmp_path, [100e-6, 101e-6])
    result = runner_main("history", "--tracking-uri", uri)
    assert result.returncode == 0, result.stderr
    assert "insufficient data: 2 runs since" in result.stdout and "nan" not in result.stdout


def test_a_store_that_is_not_there_is_one_line_and_stays_not_there(tmp_path):
    result = runner_main("history", "--tracking-uri", f"sqlite:///{tmp_path}/none/mlflow.db")
    assert result.returncode == 2 and result.stderr.startswith("error: no MLflow store at ")
    assert not (tmp_path / "none").exists()


def _strict_json(text: str):
    def refuse(constant: str):
        raise ValueError(f"{constant} is not JSON")

    return json.loads(text, parse_constant=refuse)


def test_history_with_no_arguments_reads_the_default_store_and_says_so(slowed, monkeypatch, tmp_path):
    import runner.locations

    uri, _ = slowed
    store = Path(uri.removeprefix("sqlite:///"))
    (tmp_path / "outputs").mkdir()
    shutil.copyfile(store, tmp_path / "outputs" / "mlflow.db")
    monkeypatch.setattr(runner.locations, "output_root", lambda: tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    result = runner_main("history", "--json")
    assert result.returncode == 0, result.stderr
    assert result.stderr.startswith(f"runs of {tmp_path / 'outputs' / 'mlflow.db'} (run.py's default store")
    (case,) = _strict_json(result.stdout)
    assert len(case["runs"]) == 14
    monkeypatch.setattr(runner.locations, "output_root", lambda: tmp_path / "elsewhere")
    missing = runner_main("history")
    assert missing.returncode == 2 and missing.stderr.startswith("error: no store at ")


def test_a_step_read_from_folders_names_the_run_by_its_sweep_folder_and_job(tmp_path):
    """Runs read from their folders have no MLflow id: a step names its first run by the folder's last two parts."""
    rng = np.random.default_rng(3)
    for i in range(14):
        value = 100e-6 * (1.1 if i >= 7 else 1.0) * math.exp(rng.normal(0, 0.01))
        run_dir = tmp_path / f"night-{i:02d}" / "0"
        run_dir.mkdir(parents=True)
        metrics = {"time_typical_s": value, "time_median_s": value, "time_iqr_s": 0.0, "first_call_s": value}
        Result(Status.FINISHED, CONFIG, metrics, MACHINE, started=1.79e9 + 3600 * i).save(run_dir)
    result = runner_main("history", *(str(tmp_path / f"night-{i:02d}") for i in range(14)))
    assert result.returncode == 0, result.stderr
    assert "  regression: 1.1" in result.stdout and " from run night-07/0 (2026-09-21 " in result.stdout, result.stdout


def test_a_folder_argument_finds_the_runs_below_it_and_json_is_strict(tmp_path):
    """Two runs of a case in folders of their own under one folder: a series of two, its step 'insufficient data'
    with no interval, which strict JSON says as null."""
    for i, value in enumerate((1e-4, 1.1e-4)):
        run_dir = tmp_path / "outputs" / "runs" / f"2026-11-2{i}" / "12-00"
        run_dir.mkdir(parents=True)
        metrics = {"time_typical_s": value, "time_median_s": value, "time_iqr_s": 0.0, "first_call_s": value}
        Result(Status.FINISHED, CONFIG, metrics, MACHINE, started=1.79e9 + 3600 * i).save(run_dir)
    result = runner_main("history", str(tmp_path / "outputs"), "--json", "--html", str(tmp_path / "pages"))
    assert result.returncode == 0, result.stderr
    (case,) = _strict_json(result.stdout)
    assert len(case["runs"]) == 2 and [s["label"] for s in case["steps"]] == ["insufficient data"]
    assert case["steps"][0]["low"] is None
    index = (tmp_path / "pages" / "index.html").read_text()
    assert "2 runs, now 110 µs (2026-09-21 " in index, index


def test_the_issue_81_store_of_12_sweeps_of_two_seeds_fails_the_gate_at_its_7th_sweep():
    """`runner history` takes the runs of a sweep (its MLflow parent run) as one point: the issue's 24 runs, two seeds
    a sweep, fail --fail-on regression from the 13th run, the 7th sweep's first."""
    from test_steps import ISSUE_81_US

    entries = [
        ("case", "chain", "m", "EPYC", history.Entry(f"run{i}", 1.79e9 + 60 * i, us * 1e-6, sweep=f"p{i // 2}"))
        for i, us in enumerate(ISSUE_81_US)
    ]
    (found,) = history.build(entries)
    (step,) = found.steps
    assert (step.index, found.entries[step.index].run_id, step.label, step.significant) == (
        12,
        "run12",
        "regression",
        True,
    )
    assert step.p_value < 0.01 and [h.case for h, _ in gate.failing_steps([found], {"regression"})] == ["case"]


def test_three_sweeps_of_two_seeds_are_three_points_too_few_to_tell():
    entries = [
        ("case", "chain", "m", "EPYC", history.Entry(f"run{i}", 1.79e9 + 60 * i, 1e-4, sweep=f"p{i // 2}"))
        for i in range(6)
    ]
    (found,) = history.build(entries)
    (step,) = found.steps
    assert describe.describe_step(found, step).startswith("insufficient data: 6 runs in 3 sweeps since ")
    assert describe.describe_step(found, step).endswith(", 4 sweeps tell a step")


def test_a_history_page_says_what_decided_it_and_the_index_is_in_the_order_it_says(tmp_path):
    """Issue 77: the words control and busy were on no page, a case fitted relative to its control plotted raw times,
    there was no legend, and the index listed cases alphabetically under 'regression first, the newest first'."""
    from runner.history import page
    from runner.history.series import Entry, History
    from runner.history.steps import Label, Step

    def entries(start: float, busy: float = 0.0) -> list[Entry]:
        return [Entry(f"r{start + i:.0f}", start + i, 1e-4, control_s=5e-5, busy=busy if i % 2 else 0.0)
                for i in range(6)]  # fmt: skip

    step = Step(3, 1.1, 1.05, 1.15, Label.REGRESSION)
    control = History("c", "matmul", "m", "box", entries(100.0), is_control=True)
    relative = History("r", "b-relative", "m", "box", entries(0.0, busy=3.0), [step], control_name="matmul")
    newest = History("n", "a-newest", "m", "box", entries(200.0))
    index = page.write([newest, control, relative], tmp_path)
    listed = [line.split(".html")[0] for line in index.read_text().split('<li><a href="')[1:]]
    assert listed == ["r-m", "n-m", "c-m"]  # the regression first, then the newest first
    pages = {name: (tmp_path / f"{name}.html").read_text() for name in listed}
    assert "the control of other cases" in pages["c-m"]
    assert (
        "Fitted relative to the control matmul" in pages["r-m"]
        and "3 of 6 runs were measured on a busy" in pages["r-m"]
    )
    assert "<td>busy</td>" in pages["r-m"] and "Fitted on the typical times themselves" in pages["n-m"]
    said = {line.split(".html")[0]: line for line in index.read_text().split('<li><a href="')[1:]}
    assert "; the control of the others;" in said["c-m"] and "; fitted on its times;" in said["n-m"]
    assert "; fitted relative to its control matmul, 3 of 6 runs on a busy machine;" in said["r-m"]


def test_a_history_page_opens_whole_in_mlflows_artifact_viewer(tmp_path):
    """Issue 77: MLflow's artifact viewer shows an HTML artifact in a sandboxed frame of its own, where the page's
    plot (a file beside it) was a broken image and a click on 'all cases' or on a run blanked the page. The page
    carries its plot, and the copy --record logs links nothing, saying where a run opens instead."""
    import base64

    from runner.history import page
    from runner.history.series import Entry, History

    runs = [Entry(f"run{i}", 1.79e9 + 60 * i, 1e-4, experiment_id="7") for i in range(4)]
    ui = "http://127.0.0.1:5077"  # a tracking server on a port of its own
    page.write([History("c", "a-case", "m", "box", runs)], tmp_path / "pages", ui, viewer=tmp_path / "logged")
    local = (tmp_path / "pages" / "c-m.html").read_text()
    png = (tmp_path / "pages" / "c-m.png").read_bytes()
    inline = f"<img src='data:image/png;base64,{base64.b64encode(png).decode()}'"
    assert inline in local and "<a href='index.html'>all cases</a>" in local  # the folder's copy: links that open
    assert f"<a href='{ui}/#/experiments/7/runs/run3?workflowType=machine_learning'>run3</a>" in local
    logged = (tmp_path / "logged" / "c-m.html").read_text()
    assert inline in logged and "<a " not in logged and "<td>run3</td>" in logged
    assert f"{ui}/#/experiments/7/runs/RUN_ID?workflowType=machine_learning" in logged  # where a run opens, said
    assert (tmp_path / "logged" / "c-m.png").read_bytes() == png


def test_a_plot_relative_to_its_control_says_so_in_full(tmp_path, monkeypatch):
    """Issue 77: a case fitted relative to its control named the control in its y label, which the shipped
    control's name made longer than the plot: only 'numpy-matmul-...-float32 batch_size=' showed, not 'control'."""
    import matplotlib.figure
    import matplotlib.text

    from runner.history import page
    from runner.history.series import Entry, History

    drawn: list[tuple[str, object, object]] = []  # each text of the saved picture, its box and the picture's
    savefig = matplotlib.figure.Figure.savefig

    def saved(figure, *args, **kwargs):
        savefig(figure, *args, **kwargs)
        renderer, (axes,) = figure.canvas.get_renderer(), figure.axes
        ticks = {*axes.get_xticklabels(), *axes.get_yticklabels()}  # those outside the axes' limits are not drawn
        said = [t for t in figure.findobj(matplotlib.text.Text) if t.get_text() and t not in ticks]
        drawn.extend((text.get_text(), text.get_window_extent(renderer), figure.bbox) for text in said)

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", saved)
    control = "numpy-matmul-inference-eager-cpu-float32 batch_size=32 n=128 threads=1"  # the shipped control's name
    runs = [Entry(f"run{i}", 1.79e9 + 60 * i, 1e-4, control_s=2.5e-4, busy=3.0 * (i == 1)) for i in range(6)]
    case = History("r", "numpy-mlp-gradients-eager-cpu-float32 batch_size=32", "m", "box", runs, control_name=control)
    page.write([case], tmp_path)
    assert f"relative to the control {control}" in " ".join(text for text, _, _ in drawn)
    for text, box, frame in drawn:  # each whole on the picture
        assert frame.x0 <= box.x0 and box.x1 <= frame.x1 and frame.y0 <= box.y0 and box.y1 <= frame.y1, text


def _folder_run(root: Path, name: str, started: float, status: str = Status.FINISHED, **config) -> None:
    run_dir = root / name
    run_dir.mkdir(parents=True)
    metrics = {"time_typical_s": 1e-4, "time_median_s": 1e-4, "time_iqr_s": 0.0, "first_call_s": 1e-4}
    error = "RuntimeError: the workload crashed (job.log)" if status == Status.FAILED else None
    Result(status, {**CONFIG, **config}, metrics if status == Status.FINISHED else {}, MACHINE, error=error,
           started=started).save(run_dir)  # fmt: skip


def test_a_case_whose_newest_runs_failed_is_failing_since_its_first_failure_and_fails_its_gate(tmp_path):
    """Issue 75: a case whose runs started failing dropped out of its history without a word, and --fail-on
    regression stayed green while the case it guarded no longer ran."""
    for i in range(6):
        _folder_run(tmp_path, f"night-{i:02d}", 1.79e9 + 86400 * i, Status.FAILED if i >= 4 else Status.FINISHED)
    result = runner_main("history", str(tmp_path), "--fail-on", "failure")
    assert result.returncode == 1
    said = f"failing since run {tmp_path.name}/night-04 (2026-09-25 14:13)"
    assert said in result.stdout and "2 runs failed, the last: RuntimeError: the workload crashed" in result.stdout
    assert result.stderr.startswith("failing: ") and said in result.stderr
    assert runner_main("history", str(tmp_path), "--html", str(tmp_path / "pages")).returncode == 0
    assert said in (tmp_path / "pages" / "index.html").read_text().split("<h2>Series</h2>")[0]  # listed first
    assert runner_main("history", str(tmp_path), "--fail-on", "regression").returncode == 0  # a step's label only
    (case,) = _strict_json(runner_main("history", str(tmp_path), "--json").stdout)
    assert [g["gap"] for g in case["gaps"]] == ["failure"] and len(case["runs"]) == 4


def test_a_case_absent_from_its_machines_newest_sweeps_has_no_data_since_its_last_run(tmp_path):
    for i in range(6):  # batch 32 every night; batch 8 only the first two
        _folder_run(tmp_path, f"a-{i:02d}", 1.79e9 + 86400 * i)
        if i < 2:
            _folder_run(tmp_path, f"b-{i:02d}", 1.79e9 + 86400 * i + 60, batch_size=8)
    result = runner_main("history", str(tmp_path), "--fail-on", "missing")
    assert result.returncode == 1 and "no data since 2026-09-22 14:14:" in result.stdout, result.stdout
    assert "4 sweeps of its machine since ran without it" in result.stdout
    quieter = runner_main("history", str(tmp_path), "--fail-on", "missing", "--missing-after", "5")
    assert quieter.returncode == 0 and "no data since" not in quieter.stdout


def test_another_experiments_runs_on_the_machine_leave_a_case_present(tmp_path):
    """A user's single runs in an experiment of their own, made after the nightly sweeps on the same machine, made
    every nightly case 'no data since ...: 7 sweeps of its machine since ran without it' (found taking issue 78's
    screens); a case is missing from its own experiment's sweeps only."""
    uri = made_store(tmp_path)
    for i in range(3):
        _folder_run(tmp_path / "runs", f"night-{i}", 1.79e9 + 86400 * i)
        log_to_mlflow(tmp_path / "runs" / f"night-{i}", uri, "nightly")
    for i in range(4):
        _folder_run(tmp_path / "runs", f"mine-{i}", 1.79e9 + 86400 * 3 + 60 * i, batch_size=8)
        log_to_mlflow(tmp_path / "runs" / f"mine-{i}", uri, "mine")
    result = runner_main("history", "--tracking-uri", uri, "--fail-on", "missing")
    assert result.returncode == 0 and "no data since" not in result.stdout, result.stdout


def test_a_store_names_a_failing_case_from_its_failed_runs(tmp_path):
    """The store's FAILED runs, found by their tags as the finished ones are, make the same line."""
    uri = made_store(tmp_path)
    for i in range(5):
        _folder_run(tmp_path / "runs", f"{i}", 1.79e9 + 3600 * i, Status.FAILED if i >= 3 else Status.FINISHED)
        log_to_mlflow(tmp_path / "runs" / f"{i}", uri, "history")
    result = runner_main("history", "--tracking-uri", uri, "--fail-on", "failure")
    assert result.returncode == 1 and ": failing since run " in result.stdout and "2 runs failed" in result.stdout


def test_a_first_call_that_grows_is_a_regression_of_its_own_series_and_fails_the_gate(tmp_path):
    """Issue 75: a store of 10 nights whose first call (compilation with it) grows by 0.3 s from the 5th, its typical
    time unchanged: the first call's series has a regression from the 5th night, the times' none."""
    rng = np.random.default_rng(5)
    for i in range(10):
        run_dir = tmp_path / f"night-{i:02d}"
        run_dir.mkdir()
        typical = 1e-4 * math.exp(rng.normal(0, 0.01))
        first = (0.7 + (0.3 if i >= 4 else 0.0)) * math.exp(rng.normal(0, 0.02))
        metrics = {"time_typical_s": typical, "time_median_s": typical, "time_iqr_s": 0.0, "first_call_s": first}
        Result(Status.FINISHED, CONFIG, metrics, MACHINE, started=1.79e9 + 86400 * i).save(run_dir)
    result = runner_main("history", str(tmp_path), "--fail-on", "regression")
    assert result.returncode == 1, result.stdout
    (line,) = [line.strip() for line in result.stdout.splitlines() if line.strip().startswith("first call:")]
    assert line.startswith("first call: regression 1.4") and f"from run {tmp_path.name}/night-04 " in line
    before, after = (float(v.removesuffix(" ms")) for v in line.rsplit(": ", 1)[1].split(" → "))
    assert 650 < before < 750 and 950 < after < 1050  # the levels either side, as the line says them
    assert "no step" in result.stdout  # the typical time's own series
    (case,) = _strict_json(runner_main("history", str(tmp_path), "--json").stdout)
    assert [(s["metric"], s["index"], s["label"]) for s in case["figure_steps"]] == [("first_call_s", 4, "regression")]
    assert case["steps"] == [] and case["gaps"] == []


def test_a_case_run_on_several_hosts_names_each_runs_host_and_a_case_on_one_host_none(tmp_path):
    """Issue 78: no history said where a run ran. A pool's runs of one kind of machine are one series: its page, --json
    and --markdown name each run's host, by the rule a sweep's tables use; a case run on one host shows no host."""
    from runner.history import as_json, markdown, page
    from runner.record.runs import from_dirs

    metrics = {"time_typical_s": 1e-4, "time_median_s": 1e-4, "time_iqr_s": 0.0, "first_call_s": 1e-4}
    for i in range(4):
        for batch, host in ((32, f"ci-{i % 2 + 1}"), (64, "box")):
            config, machine = {**CONFIG, "batch_size": batch}, {**MACHINE, "hostname": host}
            (run_dir := tmp_path / "runs" / f"{batch}-{i}").mkdir(parents=True)
            Result(Status.FINISHED, config, metrics, machine, started=1.79e9 + 3600 * i).save(run_dir)
    found = history.from_runs(from_dirs(sorted((tmp_path / "runs").iterdir())))
    pool, one = sorted(found, key=lambda h: h.case_name)  # batch_size=32, then 64
    page.write(found, tmp_path / "pages")
    pool_page, one_page = ((tmp_path / "pages" / f"{page.page_name(h)}.html").read_text() for h in (pool, one))
    assert (
        "<th>started</th><th>host</th><th>typical</th>" in pool_page
        and pool_page.count("<td class='host'>ci-2</td>") == 2
    )
    assert "<th>host</th>" not in one_page and ">box</td>" not in one_page
    cases = {c["case_name"]: c for c in json.loads(as_json.to_json(found))}
    assert [r["host"] for r in cases[pool.case_name]["runs"]] == ["ci-1", "ci-2", "ci-1", "ci-2"]
    assert not any("host" in r for r in cases[one.case_name]["runs"])
    comment = markdown.comment(found, None, set())
    assert "| 100 µs on ci-2 |" in comment and " on box" not in comment, comment

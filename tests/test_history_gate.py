"""A history a CI job can gate on (issue 64): the steps of a store's many cases held to a false-discovery rate
together, the numbers each run records against float64 fitted over time, and a summary for a pull request's comment.
Every series is seeded: the same answer on every run."""

from __future__ import annotations

import html
import math
import re
from pathlib import Path

import numpy as np
import pytest
from helpers import FAST_TIMING, made_store, run_cli, runner_main

from runner.history import build as history
from runner.history import describe, gate, markdown
from runner.history.build import build
from runner.history.describe import describe_number
from runner.history.fdr import fdr_summary
from runner.history.series import Entry, History
from runner.history.steps import Label, Point, find_steps
from runner.report.ratio import APART_SD, PROCESS_SD

PLUGIN = Path(__file__).parent / "plugin"
QUIET, REAL, RUNS, AT = 100, 5, 40, 20  # 100 cases of noise, 5 with a real 10% step at run 20 of 40


def _store(seed: int) -> list[tuple[str, str, str, str, Entry]]:
    """QUIET + REAL cases on one machine, RUNS runs each, an hour apart, each run's time moved as runs made apart
    move (the machine's drift between runs, APART_SD, and its process's offset, PROCESS_SD, as
    benchmarks/history_sim.py draws them); the last REAL cases 10% slower from run AT on."""
    rng = np.random.default_rng(seed)
    rows = []
    for case in range(QUIET + REAL):
        for i in range(RUNS):
            ratio = 1.1 if case >= QUIET and i >= AT else 1.0
            value = 100e-6 * ratio * math.exp(rng.normal(0, APART_SD) + rng.normal(0, PROCESS_SD))
            rows.append(
                (f"case{case:03d}", f"case {case}", "m", "machine", Entry(f"r{case}-{i}", 1.79e9 + 3600 * i, value))
            )
    return rows


def _alerts(histories: list[History]) -> tuple[int, int]:
    """(false alerts: steps in a quiet case, real steps found: REAL cases with a step within 2 runs of AT), counting
    only the steps significant across the store."""
    kept = [(int(h.case[4:]), s) for h in histories for s in h.steps if s.label != Label.INSUFFICIENT and s.significant]
    false = sum(case < QUIET for case, _ in kept)
    found = len({case for case, s in kept if case >= QUIET and abs(s.index - AT) <= 2})
    return false, found


def test_a_store_of_100_quiet_cases_raises_fewer_false_alerts_held_to_a_false_discovery_rate():
    """Three seeded stores: each series alone raises false alerts in proportion to the store's 100 quiet cases (4 in
    the three here); held to a rate of 5% together, none here, and every real 10% step that a series alone finds is
    still found."""
    alone, together = np.zeros(2, int), np.zeros(2, int)
    for seed in range(3):
        rows = _store(seed)
        alone += _alerts(build(rows, fdr=None))
        together += _alerts(build(rows, fdr=0.05))
    assert alone[0] >= 3, alone  # 4 here
    assert together[0] <= 1 and together[0] < alone[0], together  # none here
    assert together[1] == alone[1] >= 13, (alone, together)  # of the 15 real steps, 15 found here either way


def test_the_false_discovery_line_says_what_benjamini_hochberg_holds():
    histories = build(_store(0), fdr=0.05)
    kept = sum(s.significant for h in histories for s in h.steps if math.isfinite(s.q_value))
    dropped = sum(not s.significant for h in histories for s in h.steps)
    line = fdr_summary(histories, 0.05)
    assert line.startswith(
        f"105 series (a case on a machine): {kept} steps significant at a false-discovery rate of 5%"
    )
    assert f"about {0.05 * kept:.2g} of these {kept}" in line and f"; {dropped} more found by a series alone" in line
    assert dropped > 0 and all(s.label != Label.INSUFFICIENT for h in histories for s in h.steps)
    quiet = [h for h in histories if int(h.case[4:]) < QUIET and h.steps]
    assert all(not s.significant and s.q_value > 0.05 for h in quiet for s in h.steps)  # shown, but no alert
    assert "not significant across the store (q " in describe.describe_step(quiet[0], quiet[0].steps[0])


def test_a_step_p_value_is_small_for_a_real_step_and_rarely_small_in_noise():
    """The p-value from the detector's own t test and the places it searched: under the noise it assumes, a series
    with no step gets p <= 0.05 at most about 5% of the time (1.5% of 5,000 series in BENCHMARKS.md)."""
    rng = np.random.default_rng(11)
    smallest = []
    for _ in range(300):
        logs = math.log(1e-3) + rng.normal(0, 0.03, 40)
        points = [Point(*np.exp([y, y - 0.05, y + 0.05]).tolist()) for y in logs]
        smallest.append(min((s.p_value for s in find_steps(points)), default=1.0))
    assert np.mean(np.array(smallest) <= 0.05) <= 0.05, sorted(smallest)[:20]
    logs = math.log(1e-3) + rng.normal(0, 0.01, 40) + np.where(np.arange(40) >= 20, math.log(1.1), 0)
    (step,) = find_steps([Point(*np.exp([y, y - 0.02, y + 0.02]).tolist()) for y in logs])
    assert step.index == 20 and 0 < step.p_value < 1e-6


def test_fdr_outside_0_and_1_is_refused_in_one_line(tmp_path):
    for value in ("2", "0", "nan"):
        done = runner_main("history", str(tmp_path), "--fdr", value)
        assert done.returncode == 2 and done.stderr.startswith("error: --fdr must be in (0, 1)"), done.stderr
        assert done.stderr.count("\n") == 1


def _numbers(errors: list[float], tokens: list[float] | None = None) -> list[tuple[str, str, str, str, Entry]]:
    """A generation case's 12 nights, its time steady, its numbers as given; numpy 2.3.5 at commit aaa for the
    first 6 nights, numpy 2.4.0 at bbb after."""
    rows = []
    for i, error in enumerate(errors):
        version = "numpy 2.3.5 @ aaaaaaaaaa" if i < 6 else "numpy 2.4.0 @ bbbbbbbbbb"
        numbers = {"max_rel_err_vs_reference": error} | ({"tokens_differ": tokens[i]} if tokens else {})
        value = 1e-3 * (1 + 0.002 * math.sin(i))
        entry = Entry(f"night{i:02d}", 1.79e9 + 86_400 * i, value, version=version, numbers=numbers)
        rows.append(("gen", "generate | greedy", "m", "machine", entry))
    return rows


def test_numbers_that_change_from_the_7th_run_are_a_numeric_change_named_with_the_versions_either_side():
    (h,) = build(_numbers([2.1e-7] * 6 + [8.4e-7] * 6, tokens=[0.0] * 6 + [2.0] * 6))
    assert h.steps == []  # its time did not move
    (error,) = h.numbers["max_rel_err_vs_reference"]
    (tokens,) = h.numbers["tokens_differ"]
    assert (error.index, error.label, tokens.index, tokens.label) == (6, Label.NUMERIC, 6, Label.NUMERIC)
    said = describe_number(h, "max_rel_err_vs_reference", error)
    assert said.startswith("numeric change: max rel err vs float64 2.1e-07 → 8.4e-07 from run night06 (")
    assert said.endswith("; numpy 2.3.5 @ aaaaaaaaaa → numpy 2.4.0 @ bbbbbbbbbb)")
    assert "tokens differing from float64's 0 → 2 from run night06" in describe_number(h, "tokens_differ", tokens)
    assert gate.failing([h], gate.fail_labels("numeric")) == [
        f"generate | greedy: {describe_number(h, name, s)}" for name, (s,) in h.numbers.items()
    ]
    assert gate.failing([h], gate.fail_labels("regression")) == []


def test_the_html_pages_say_a_numeric_change_and_give_each_runs_numbers(tmp_path):
    from runner.history.page import page_name, write

    (h,) = build(_numbers([2.1e-7] * 6 + [8.4e-7] * 6, tokens=[0.0] * 6 + [2.0] * 6))
    index = write([h], tmp_path).read_text()
    page = (tmp_path / f"{page_name(h)}.html").read_text()
    (error,) = h.numbers["max_rel_err_vs_reference"]
    said = html.escape(describe_number(h, "max_rel_err_vs_reference", error))
    assert said in index and said in page
    assert "<th>max rel err vs float64</th>" in page and "<td>8.4e-07</td>" in page
    assert "<th>tokens differing from float64&#x27;s</th>" in page
    assert describe.verdict(h) == f"no step in 12 runs; {describe_number(h, 'max_rel_err_vs_reference', error)}; " + (
        describe_number(h, "tokens_differ", h.numbers["tokens_differ"][0])
    )


def test_exact_numbers_that_stay_exact_or_wander_within_their_noise_are_no_change():
    rng = np.random.default_rng(4)
    (exact,) = build(_numbers([0.0] * 12))
    (wandering,) = build(_numbers(list(2e-7 * np.exp(rng.normal(0, 0.3, 12)))))
    assert exact.numbers == {"max_rel_err_vs_reference": []}
    assert wandering.numbers == {"max_rel_err_vs_reference": []}
    (moved,) = build(_numbers([0.0] * 6 + [3e-7] * 6))  # exact, then not: EXACT stands for 0 on the log scale
    assert [s.index for s in moved.numbers["max_rel_err_vs_reference"]] == [6]


def test_an_error_that_moves_less_than_twofold_is_no_numeric_change_and_every_token_is_one():
    """Another, equally careful order of the same sums moves the error a little (the chain workload's, by 1% with
    twice its layers): found by the detector, as the numbers have no noise, but no numeric change, and no gate fails
    on it. Twofold is one; so is a single token more."""
    (reordered,) = build(_numbers([1.86e-7] * 6 + [1.0e-7] * 6))
    (doubled,) = build(_numbers([1.86e-7] * 6 + [3.72e-7] * 6))
    (a_token,) = build(_numbers([2e-7] * 12, tokens=[3.0] * 6 + [4.0] * 6))
    assert reordered.numbers == {"max_rel_err_vs_reference": []}
    assert gate.failing([reordered], gate.fail_labels("numeric")) == []
    assert [s.index for s in doubled.numbers["max_rel_err_vs_reference"]] == [6]
    assert a_token.numbers["max_rel_err_vs_reference"] == [] and [
        s.index for s in a_token.numbers["tokens_differ"]
    ] == [6]


def test_a_run_compared_with_its_reference_without_an_error_in_mlflow_was_exact():
    """MLflow keeps no log10 of an exact result's error (runner.tracking.run_page), only its tolerance's verdict."""
    assert history.recorded_numbers({"within_reference_tolerance": 1.0}) == {"max_rel_err_vs_reference": 0.0}
    assert history.recorded_numbers({"time_typical_s": 1.0}) == {}
    recorded = {"max_rel_err_vs_reference": 2e-7, "tokens_differ": 0.0, "within_reference_tolerance": 1.0}
    assert history.recorded_numbers(recorded) == {"max_rel_err_vs_reference": 2e-7, "tokens_differ": 0.0}


def test_fail_on_takes_a_label_by_its_first_word():
    assert gate.fail_labels("numeric,regression") == {"numeric change", "regression"}
    assert gate.fail_labels("numeric change") == {"numeric change"}
    with pytest.raises(LookupError, match="--fail-on numbers: numbers is no label"):
        gate.fail_labels("numbers")


CHAIN = ["model=chain", "model.features=64", "task=inference", "backend=numpy", "threads=1", "batch_size=8"]


def _recorded(tmp_path: Path, uri: str, offset: str) -> dict:
    """A real run of the chain workload (tests/plugin/chain_model.py) with RUNNER_TEST_OFFSET=`offset`, recorded
    into `uri`: its MLflow run (metrics as MLflow holds them, tags, params)."""
    from mlflow.tracking import MlflowClient

    done = run_cli(
        *CHAIN,
        *FAST_TIMING,
        f"hydra.searchpath=[file://{PLUGIN / 'conf'}]",
        f"tracking.uri={uri}",
        f"tracking.experiment=made-{offset}",
        f"hydra.run.dir={tmp_path}/run-{offset}",
        env={"PYTHONPATH": str(PLUGIN), "RUNNER_TEST_OFFSET": offset},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    client = MlflowClient(uri)
    (run,) = client.search_runs([client.get_experiment_by_name(f"made-{offset}").experiment_id])
    return {"metrics": run.data.metrics, "tags": run.data.tags, "params": run.data.params}


def test_a_workload_whose_numbers_change_from_the_7th_night_fails_the_numeric_gate(tmp_path):
    """Two real runs of the chain workload, recorded as every run is (its error vs float64 logged as MLflow's log10
    and read back): as it is, and computing less carefully (RUNNER_TEST_OFFSET=100: its error 8x, its config and
    case unchanged).
    12 nights in a store, the first 6 with the first run's record, the rest with the second's at a new commit: the
    history reads the numbers from the store, finds their change at the 7th night, and --fail-on numeric fails."""
    from mlflow.entities import Metric, Param, RunTag
    from mlflow.tracking import MlflowClient

    uri = made_store(tmp_path)
    made = [_recorded(tmp_path, uri, offset) for offset in ("0", "100")]
    assert made[0]["metrics"]["max_rel_err_vs_reference_log10"] != made[1]["metrics"]["max_rel_err_vs_reference_log10"]
    client = MlflowClient(uri)
    night_ids = []
    for night in range(12):
        run = client.create_run(
            client.create_experiment(f"n{night}"), start_time=1_790_000_000_000 + night * 86_400_000
        )
        record = made[night >= 6]
        tags = {k: v for k, v in record["tags"].items() if k not in ("mlflow.runName", "runner.run_key")}
        tags["mlflow.source.git.commit"] = "b" * 40 if night >= 6 else "a" * 40
        metrics = {**record["metrics"], "time_typical_us": 1000.0, "time_median_us": 1000.0}
        # the two records' first calls and peaks differ as two runs' do, and are series of their own: held to the first
        # record's, so that only the numbers change
        metrics |= {k: v for k, v in made[0]["metrics"].items() if k.startswith(("first_call", "load", "peak"))}
        client.log_batch(
            run.info.run_id,
            metrics=[Metric(k, v, 0, 0) for k, v in metrics.items() if not k.startswith("trace/")],
            params=[Param(k, v) for k, v in record["params"].items()],
            tags=[RunTag(k, v) for k, v in tags.items()],
        )
        client.set_terminated(run.info.run_id, "FINISHED")
        night_ids.append(run.info.run_id)
    for name in ("made-0", "made-100"):
        for run in client.search_runs([client.get_experiment_by_name(name).experiment_id]):
            client.delete_run(run.info.run_id)
    done = runner_main("history", "--tracking-uri", uri, "--fail-on", "numeric")
    assert done.returncode == 1, done.stdout + done.stderr
    (line,) = [line for line in done.stderr.splitlines() if line.startswith("failing: ")]
    assert "numeric change: max rel err vs float64 " in line and f"from run {night_ids[6][:12]}" in line
    assert "@ aaaaaaaaaa → numpy " in line and line.endswith("@ bbbbbbbbbb)"), line
    assert runner_main("history", "--tracking-uri", uri, "--fail-on", "regression").returncode == 0


WEAK_SCATTER = 0.035  # its runs' scatter: a 6% step in 20 runs that scatter 3.5% is kept alone, not across 45


def _comment_histories() -> list[History]:
    """A regression in a case whose name holds a pipe and a tag, a numeric change, a step too weak (for its runs'
    scatter) to keep across the store, and two quiet cases (one too short to tell)."""
    rng = np.random.default_rng(7)
    rows = []
    for case, name, at, size, scatter in (
        ("slow", "mlp | batch_size=32 <b>", 10, 1.3, 0.005),
        ("weak", "weak_one", 10, 1.06, WEAK_SCATTER),
        ("calm", "calm", None, 1.0, 0.005),
    ):
        for i in range(20):
            value = 1e-3 * (size if at is not None and i >= at else 1.0) * math.exp(rng.normal(0, scatter))
            rows.append((case, name, "m", "EPYC · 2 cores", Entry(f"{case}{i}", 1.79e9 + 3600 * i, value)))
    rows += _numbers([2.1e-7] * 6 + [8.4e-7] * 6)
    rows += [("short", "short", "m", "EPYC · 2 cores", Entry("short0", 1.79e9, 1e-3))]
    rows += [
        (f"noise{c}", f"noise{c}", "m", "EPYC", Entry(f"n{c}-{i}", i, 1.0 + 0.001 * i))
        for c in range(40)
        for i in range(6)
    ]
    return build(rows, fdr=0.05)


def _cells(row: str) -> list[str]:
    """A markdown table row's cells as GitHub renders them (markdown-it's GFM table, escapes undone)."""
    from markdown_it import MarkdownIt

    rendered = MarkdownIt("commonmark").enable("table").render(f"| {'a | ' * 5}a |\n|{'---|' * 6}\n{row}\n")
    return [html.unescape(re.sub("<[^>]+>", "", c)) for c in re.findall(r"<td>(.*?)</td>", rendered)]


def test_the_markdown_comment_has_a_verdict_a_table_with_the_alerts_first_and_the_quiet_cases_folded():
    histories = _comment_histories()
    weak = next(h for h in histories if h.case == "weak")
    assert weak.steps and not weak.steps[0].significant  # a 6% step, alone it would alert: not across 45 series
    text = markdown.comment(histories, 0.05, gate.fail_labels("regression,numeric"))
    lines = text.splitlines()
    assert lines[0] == "### runner history: ❌ fails `--fail-on numeric,regression`: 2 alerts in 45 series"
    assert lines[2].startswith("45 series (a case on a machine): 2 steps significant at a false-discovery rate of 5%")
    table = [line for line in lines[: lines.index("<details><summary>42 quiet series (no step found)</summary>")]]
    rows = [line for line in table if line.startswith("| ") and not line.startswith("| case |")]
    cells = [_cells(row) for row in rows]
    assert all(len(c) == 6 for c in cells), cells
    assert [c[0] for c in cells] == ["mlp | batch_size=32 <b>", "generate | greedy", "weak_one"]  # alerts first
    assert cells[0][3].startswith("1.3") and cells[0][4] == "regression" and cells[0][5].startswith("q ")
    assert cells[1][3] == "max rel err vs float64 2.1e-07 → 8.4e-07" and cells[1][4] == "numeric change"
    assert cells[2][4] == "regression, not significant across the store"
    assert "mlp \\| batch\\_size=32 \\<b\\>" in rows[0]  # the pipe escaped: it splits no cell
    folded = lines[lines.index("<details><summary>42 quiet series (no step found)</summary>") :]
    assert folded[-1] == "</details>" and "| calm | EPYC · 2 cores | " in text and "| short | " in "\n".join(folded)
    assert len([line for line in folded if line.startswith("| ") and not line.startswith("| case |")]) == 42


def test_the_comment_passes_where_the_gate_would_and_says_a_rerun_s_word():
    from dataclasses import replace

    histories = _comment_histories()
    passing = markdown.comment(histories, 0.05, {"suspicious"})
    assert passing.splitlines()[0] == "### runner history: ✅ passes `--fail-on suspicious`: 0 alerts in 45 series"
    slow = next(h for h in histories if h.case == "slow")
    slow.entries[-1] = replace(slow.entries[-1], confirmed="no: not confirmed by a re-run (run x): 1.01x ...")
    cleared = markdown.comment(histories, 0.05, {"regression"}, confirm=True)
    assert cleared.splitlines()[0].startswith("### runner history: ✅ passes `--fail-on regression --confirm`: 1 alert")
    (row,) = [line for line in cleared.splitlines() if line.startswith("| mlp")]
    assert _cells(row)[5].startswith("not confirmed, q ")


def test_markdown_from_the_command_line(tmp_path):
    from test_history import _store as store_of

    rng = np.random.default_rng(3)
    uri, ids = store_of(
        tmp_path, [100e-6 * (1.1 if i >= 7 else 1.0) * math.exp(rng.normal(0, 0.01)) for i in range(14)]
    )
    done = runner_main("history", "--tracking-uri", uri, "--markdown", "--fail-on", "regression")
    assert done.returncode == 1 and "failing: numpy-mlp-gradients" in done.stderr
    first, *rest = done.stdout.splitlines()
    assert first == "### runner history: ❌ fails `--fail-on regression`: 1 alert in 1 series"
    (row,) = [line for line in rest if line.startswith("| numpy-mlp")]
    assert _cells(row)[4] == "regression" and "<details>" not in done.stdout
    both = runner_main("history", "--tracking-uri", uri, "--markdown", "--json")
    assert both.returncode == 2 and "not allowed with argument" in both.stderr


def test_a_nightly_gate_fails_on_what_the_newest_runs_changed_not_on_an_old_step(tmp_path):
    """--new-within N: a step whose first run is among each series' newest N runs fails the gate; one from a week ago
    is history (it still prints), and fails no night again. Over 45 real A/A nights (BENCHMARKS.md) this took the
    nights with a false alarm from 13 to 1."""
    from test_history import _store

    old, _ = _store(tmp_path / "old", [100e-6] * 6 + [150e-6] * 6)
    new, _ = _store(tmp_path / "new", [100e-6] * 10 + [150e-6] * 2)
    for uri, fails in ((old, 0), (new, 1)):
        done = runner_main("history", "--tracking-uri", uri, "--fail-on", "regression", "--new-within", "3")
        assert done.returncode == fails, done.stderr
        assert "regression: 1.5" in done.stdout  # printed either way
    every = runner_main("history", "--tracking-uri", old, "--fail-on", "regression")
    assert every.returncode == 1
    comment = runner_main(
        "history", "--tracking-uri", old, "--fail-on", "regression", "--new-within", "3", "--markdown"
    )
    assert comment.returncode == 0  # the comment's headline says what the exit status says, the old step listed
    assert comment.stdout.startswith("### runner history: ✅ passes `--fail-on regression --new-within 3`: 0 alerts")
    assert "| 1.5x" in comment.stdout or "| 1.50x" in comment.stdout, comment.stdout
    bad = runner_main("history", "--tracking-uri", old, "--fail-on", "regression", "--new-within", "0")
    assert bad.returncode == 2 and bad.stderr.startswith("error: --new-within must be a number of runs, 1 or more")

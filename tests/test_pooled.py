"""A sweep's answer: replicates (runs that differ only in seed) pooled, each configuration against the fastest, one
sentence, a short table, the parent run's metrics and tags, and speedup.png drawing the same figures."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pandas as pd
import pytest
from helpers import identified

from runner.config import PROJECT_ROOT
from runner.launch.sweep import summary as sweep_summary
from runner.measure.samples import typical_s
from runner.record.table import format_ratio, format_seconds
from runner.report import plots, pooled, sweep_answer
from runner.report.comparison import Verdict

ROUNDS = 20
PER_ROUND = 5


def job(rng, backend: str, seed: int, seconds: float, phase: np.ndarray, run_dir: str) -> dict:
    """One job of a sweep measured in interleaved rounds: `seconds` per call, the machine's shared phase per
    round, a little noise of its own."""
    rounds = np.repeat(np.arange(1, ROUNDS + 1), PER_ROUND)
    samples = seconds * np.exp(np.repeat(phase, PER_ROUND) + rng.normal(0, 0.02, rounds.size))
    return {
        "run": f"{backend} · seed={seed}",
        "run_dir": run_dir,
        "status": "FINISHED",
        "params.model.name": "mlp",
        "params.task.name": "gradients",
        "params.batch_size": 32,
        "params.backend.name": backend,
        "params.seed": seed,
        "metrics.time_median_s": float(np.median(samples)),
        "metrics.machine_other_runnable": 0.1,
        "samples_s": samples,
        "sample_rounds": rounds,
        "size": np.nan,  # not a size sweep
        "size_name": None,
    }


def pool(frame: pd.DataFrame) -> list[pooled.Pooled]:
    """The sweep's answer, its runs' identities computed from the params as they are now (a test may change them)."""
    return pooled.pool(identified(frame))


def sweep(times: dict[str, float], seeds: int = 2, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    phase = rng.normal(0, 0.1, ROUNDS)
    rows = [
        job(rng, backend, s, seconds, phase, f"/sweep/{i * seeds + s}")
        for i, (backend, seconds) in enumerate(times.items())
        for s in range(seeds)
    ]
    return identified(pd.DataFrame(rows))


def test_replicates_are_pooled_into_one_row_per_configuration_against_the_fastest():
    found = pool(sweep({"torch": 29e-6 * 18, "numpy": 18e-6, "jax": 18e-6 * 250}))
    assert [(p.label, p.runs) for p in found] == [("numpy", 2), ("torch", 2), ("jax", 2)]  # fastest first
    assert found[0].verdict == Verdict.FASTEST and found[0].ratio == 1.0
    torch, jax = found[1], found[2]
    assert torch.ratio == pytest.approx(29 * 18 / 18, rel=0.03) and jax.ratio == pytest.approx(250, rel=0.03)
    assert torch.low < torch.ratio < torch.high < jax.low  # the intervals hold the ratios and part them
    assert torch.verdict == jax.verdict == Verdict.SLOWER
    assert torch.time_s / found[0].time_s == pytest.approx(torch.ratio, rel=0.05)  # agrees with the medians


def test_the_answer_says_who_is_fastest_and_by_how_much_in_one_sentence():
    found = pool(sweep({"numpy": 18e-6, "torch": 18e-6 * 29, "jax": 18e-6 * 250}))
    sentence = sweep_answer.sentence(found)
    assert sentence.startswith(f"numpy fastest ({format_seconds(found[0].time_s)}); torch")
    assert f"torch {format_ratio(found[1].ratio)} {sweep_answer.interval_text(found[1])}" in sentence
    assert "the order is certain" in sentence and "±" in sentence  # a quiet machine: how close the sizes are


def test_the_sizes_are_said_in_the_intervals_own_terms_on_a_busy_machine_too():
    """'the sizes uncertain: busy machine' sat beside ±5% intervals (issue 48): a busy machine is in the intervals
    already; the sentence says how far they reach, and the machine is left to the warnings."""
    frame = sweep({"numpy": 1e-5, "torch": 3e-4})
    frame["metrics.machine_other_runnable"] = 2.0
    numpy, torch = found = pool(frame)
    said = sweep_answer.sentence(found)
    far = max(torch.high / torch.ratio, torch.ratio / torch.low) - 1
    assert said.endswith(f"the order is certain, the sizes known to ±{100 * far:.0f}%") and "busy" not in said
    assert 0 < far < 0.2  # the figure beside it: a narrow interval


def test_wide_intervals_and_no_interval_are_said_so():
    frame = sweep({"numpy": 1e-5, "torch": 3e-4})
    numpy, torch = pool(frame)
    wide = replace(torch, comparison=replace(torch.comparison, low=torch.ratio / 1.6, high=torch.ratio * 1.3))
    assert sweep_answer.sizes_known([wide]) == "the sizes known only to ±60%"  # it spans more than WIDE
    wider = replace(torch, comparison=replace(torch.comparison, low=torch.ratio / 29, high=torch.ratio * 2))
    assert sweep_answer.sizes_known([wider]) == "the sizes known only within a factor of 29"
    apart = replace(torch, busy=2.0, comparison=replace(torch.comparison, low=math.nan, high=math.nan))
    said = sweep_answer.sentence([replace(numpy, busy=2.0), apart])
    assert said.endswith("the sizes uncertain: no interval, and a busy machine (2.0 other runnable threads)")


def test_how_to_read_this_is_the_section_of_the_docs():
    """The words of the answer ('resolves', '1 of 5 comparisons', 'ratio from 9 rounds') are explained once, in
    docs/sweeps.md, and the same text goes with every sweep to its parent run (how-to-read.md)."""
    page = (PROJECT_ROOT / "docs" / "sweeps.md").read_text()
    assert f"## How to read this\n\n{sweep_summary.HOW_TO_READ}" in page
    for words in ("resolves", "1 of 5 comparisons", "ratio from 9 rounds", "the sizes known to", "out of budget"):
        assert words in sweep_summary.HOW_TO_READ, words


def test_identical_configurations_are_called_within_noise():
    found = pool(sweep({"numpy": 1e-5, "tnp": 1e-5}))
    assert found[1].verdict == Verdict.WITHIN_NOISE and found[1].low <= 1 <= found[1].high
    assert "within noise: " in sweep_answer.sentence(found)


def slow_start(torch_s: float) -> pd.DataFrame:
    """numpy at 10 µs, torch at `torch_s` but for its first 8 rounds, 400 times slower: a neighbour on its cores."""
    frame = sweep({"numpy": 1e-5, "torch": torch_s})
    for i in frame.index[frame["params.backend.name"] == "torch"]:
        samples = frame.at[i, "samples_s"].copy()
        samples[frame.at[i, "sample_rounds"] <= 8] *= 400
        frame.at[i, "samples_s"] = samples
        frame.at[i, "metrics.time_median_s"] = float(np.median(samples))
    return frame


def test_rounds_that_disagree_give_the_ratio_of_the_medians_and_no_interval():
    frame = slow_start(1e-5)  # as fast as numpy in its other rounds: the rounds disagree on the order
    torch = pool(frame)[1]
    assert torch.verdict == Verdict.UNSTABLE and np.isnan(torch.low)
    assert torch.ratio == pytest.approx(torch.time_s / pool(frame)[0].time_s)


def test_rounds_that_spread_but_agree_give_the_order_they_agree_on():
    """torch 20x slower in every round, 8000x in 8 of them: its rounds spread, and every one agrees (issue 77)."""
    numpy, torch = pool(slow_start(2e-4))
    assert numpy.verdict == Verdict.FASTEST and torch.verdict == Verdict.SLOWER
    assert 1 < torch.low < 20 < torch.high and "paired rounds, at least" in torch.reason
    assert sweep_answer.sentence([numpy, torch]).startswith("numpy fastest")


def test_replicates_that_stall_in_different_rounds_keep_the_figures_of_the_job_table():
    """Seen on a busy machine: each torch replicate lost its core in other rounds (a third of them each), which lifted
    most pooled rounds; the pooled time was 8x the replicates' own typical times, its ratio 66x beside 8x."""
    frame = sweep({"numpy": 1e-5, "torch": 1e-4})
    torch_rows = frame.index[frame["params.backend.name"] == "torch"]
    for stalled, i in zip((slice(0, 7), slice(7, 14)), torch_rows, strict=True):
        samples, rounds = frame.at[i, "samples_s"].copy(), frame.at[i, "sample_rounds"]
        samples[np.isin(rounds, np.unique(rounds)[stalled])] *= 300
        frame.at[i, "samples_s"] = samples
    numpy, torch = pool(frame)
    each = [typical_s(frame.at[i, "samples_s"], frame.at[i, "sample_rounds"]) for i in torch_rows]
    assert torch.time_s == pytest.approx(np.exp(np.mean(np.log(each))))
    assert torch.ratio == pytest.approx(torch.time_s / numpy.time_s)  # the ratio the figures beside it give
    assert torch.ratio == pytest.approx(10, rel=0.1)


def test_the_short_table_fits_the_ui_and_the_parent_gets_metrics_and_tags():
    found = pool(sweep({"numpy": 18e-6, "torch": 18e-6 * 29}))
    headers, cells = sweep_answer.table_cells(found)
    assert len(headers) <= 8 and [row[0] for row in cells] == ["numpy", "torch"]
    assert all(" " not in cell for row in cells for cell in row[2:5])  # no value breaks across lines
    metrics = sweep_answer.metrics(found)
    assert metrics["numpy.time_ratio"] == 1.0 and "numpy.time_ratio_ci_low" not in metrics
    assert metrics["torch.time_typical_us"] == pytest.approx(found[1].time_s * 1e6, rel=1e-3)  # 4 digits
    assert metrics["torch.time_ratio_ci_low"] < metrics["torch.time_ratio"] < metrics["torch.time_ratio_ci_high"]
    assert sweep_answer.tags(found) == {"verdict": sweep_answer.sentence(found), "fastest": "numpy"}


def test_the_parent_names_its_answer_so_that_sweeps_share_a_column():
    """Per configuration (`torch.time_ratio`) every backend got its own mostly empty column across sweeps; the
    ranks' names are the same in every sweep of one workload."""
    found = pool(sweep({"numpy": 18e-6, "torch": 18e-6 * 29, "jax": 18e-6 * 250}))
    metrics = sweep_answer.metrics(found)
    assert metrics["fastest.time_typical_us"] == metrics["numpy.time_typical_us"]
    assert metrics["next_fastest.time_ratio"] == metrics["torch.time_ratio"]
    assert metrics["next_fastest.time_ratio_ci_high"] == metrics["torch.time_ratio_ci_high"]
    assert metrics["slowest.time_ratio"] == metrics["jax.time_ratio"]
    other = sweep_answer.metrics(pool(sweep({"tensorflow": 1e-4, "torch": 3e-4}, seed=1)))
    assert {k for k in metrics if not k.startswith(("numpy.", "torch.", "jax."))} == {
        k for k in other if not k.startswith(("tensorflow.", "torch."))
    }


def test_each_workload_gets_its_own_answer():
    small, large = sweep({"numpy": 1e-5, "torch": 3e-5}), sweep({"numpy": 2e-3, "torch": 1e-3}, seed=1)
    small["params.model.hidden"], large["params.model.hidden"] = 64, 4096
    found = pool(pd.concat([small, large], ignore_index=True))
    assert [(p.workload, p.label) for p in found] == [
        ("hidden=64", "numpy"),
        ("hidden=64", "torch"),
        ("hidden=4096", "torch"),
        ("hidden=4096", "numpy"),
    ]
    assert sweep_answer.sentence(found).startswith("hidden=64: numpy fastest")
    assert {"numpy_hidden64.time_ratio", "torch_hidden4096.time_ratio"} <= set(sweep_answer.metrics(found))


def test_the_answer_has_a_job_table_narrow_enough_for_the_description():
    answer = sweep_answer.answer(sweep({"numpy": 18e-6, "torch": 18e-6 * 29}))
    assert answer.markdown.startswith("**numpy fastest")
    header = answer.details.splitlines()[0]
    assert header.count("|") - 1 <= 8 and "| torch · seed=1 #3 |" in answer.details


def test_speedup_plot_draws_time_over_the_fastest_with_intervals_on_a_log_axis(tmp_path):
    frame = sweep({"numpy": 18e-6, "torch": 18e-6 * 29, "jax": 18e-6 * 250})
    assert plots.plot_speedups(frame, tmp_path / "speedup.png").stat().st_size > 0
    found = pool(frame)
    plt = plots._pyplot()
    fig, ax = plt.subplots()
    plots._ratio_panel(ax, found, "mlp gradients")
    assert ax.get_xscale() == "log"
    bars = [patch for patch in ax.patches]
    assert [bar.get_x() + bar.get_width() for bar in bars] == pytest.approx([p.ratio for p in found])  # vs fastest
    labels = [t.get_text() for t in ax.texts]
    assert (
        labels[0].startswith("fastest")
        and labels[2] == f"{format_ratio(found[2].ratio)} {sweep_answer.interval_text(found[2])}"
    )
    assert len(ax.collections) == 1  # the interval lines
    plt.close(fig)


@pytest.mark.parametrize("seeds", [1, 2])
def test_the_terminal_ends_on_the_answer_with_a_pooled_table_only_where_seeds_were_pooled(seeds):
    from rich.console import Console

    from runner.launch.terminal import print_answer

    console = Console(width=200, record=True)
    answer = sweep_answer.answer(sweep({"numpy": 18e-6, "torch": 18e-6 * 29}, seeds=seeds))
    print_answer(console, answer)
    lines = console.export_text().strip().splitlines()
    assert lines[-1] == sweep_answer.sentence(answer.pooled)
    assert any(line.startswith("Replicates pooled") for line in lines) == (seeds > 1)


def test_a_generation_sweep_says_the_time_per_token_of_the_fastest():
    frame = sweep({"numpy": 2e-3, "jax": 5e-4})
    frame["params.task.name"] = "generate"  # the task says its parts (runner.tasks.Task.part): a token's time
    frame["metrics.tpot_p50_s"] = np.where(frame["params.backend.name"] == "jax", 1.3e-4, 5e-4)
    said = sweep_answer.sentence(pool(frame))
    assert said.startswith("generate on mlp: jax fastest (")
    assert f" a generation, {format_seconds(1.3e-4)} a token); numpy " in said


def test_a_training_sweep_says_what_it_timed_and_a_default_one_does_not():
    """The task, optimizer, model and precision a sweep fixed open its answer where not the defaults (issue 48):
    without them 'torch fastest (363 µs)' hid that a training step with Adam was timed."""
    frame = sweep({"torch": 3.6e-4, "tensorflow": 3.6e-4 * 23})
    assert sweep_answer.sentence(pool(frame)).startswith("torch fastest (")  # gradients on mlp: the defaults
    frame["params.task.name"], frame["params.optimizer.name"] = "train_step", "adam"
    found = pool(frame)
    said = sweep_answer.sentence(found)
    assert said.startswith(f"train_step (adam) on mlp: torch fastest ({format_seconds(found[0].time_s)} a step); ")
    assert sweep_answer.tags(pool(frame))["verdict"] == said
    frame["params.precision.name"] = "bf16_mixed"
    assert sweep_answer.sentence(pool(frame)).startswith("train_step (adam) on mlp in bf16_mixed precision: torch")


def test_what_varies_is_not_said_as_what_was_timed():
    small, large = sweep({"numpy": 1e-5, "torch": 3e-5}), sweep({"numpy": 2e-3, "torch": 1e-3}, seed=1)
    small["params.model.name"], large["params.model.name"] = "mlp", "transformer"
    both = pd.concat([small, large], ignore_index=True)
    both["params.task.name"] = "inference"
    said = sweep_answer.sentence(pool(both))
    assert said.startswith("inference · mlp: numpy fastest") and ". transformer: torch fastest" in said


def _labelled_ticks(axis) -> list[float]:
    """The values of an axis's labelled ticks within its view."""
    low, high = sorted(axis.get_view_interval())
    axis.axes.figure.canvas.draw()
    ticks = [t for t in axis.get_major_ticks() if t.label1.get_visible() and t.label1.get_text()]
    return [t.get_loc() for t in ticks if low <= t.get_loc() <= high]


@pytest.mark.parametrize("seconds", [(21e-6, 38e-6), (55e-6, 90e-6), (18e-6, 18e-6 * 250)])
def test_log_axes_have_a_labelled_tick_near_the_values(seconds):
    """A time axis from 21 to 38 µs had no label at all (matplotlib's log axis labels decades only, issue 48); each
    value now has a labelled tick within a factor of 2.5, on the time and on the ratio axis."""
    frame = sweep(dict(zip(("numpy", "torch"), seconds, strict=True)))
    plt = plots._pyplot()
    fig, (times, ratios) = plt.subplots(2, 1)
    plots._time_panel(times, frame.sort_values("metrics.time_median_s"), "mlp gradients")
    found = pool(frame)
    plots._ratio_panel(ratios, found, "mlp gradients")
    for axis, values in ((times.xaxis, frame["metrics.time_median_s"]), (ratios.xaxis, [p.ratio for p in found])):
        ticks = _labelled_ticks(axis)
        assert len(ticks) >= 2
        assert all(min(max(t / v, v / t) for t in ticks) < 2.5 for v in values), (ticks, list(values))
    plt.close(fig)


def test_the_time_plot_says_it_draws_one_box_per_run(tmp_path):
    """`time_per_config.png` was titled 'per configuration' over one box per run (issue 48)."""
    frame = sweep({"numpy": 18e-6, "torch": 18e-6 * 29})
    plt = plots._pyplot()
    drawn = []
    original = plt.Figure.savefig
    plt.Figure.savefig = lambda fig, *a, **k: drawn.append(fig) or original(fig, *a, **k)
    try:
        plots.plot_times(frame, tmp_path / "time_per_config.png")
    finally:
        plt.Figure.savefig = original
    (fig,) = drawn
    assert fig._suptitle.get_text().startswith("Time per call of each run")
    assert len(fig.axes[0].get_yticklabels()) == len(frame)  # a box per run: seeds not pooled here


@pytest.fixture(scope="module")
def tracked(tmp_path_factory):
    """A tracked sweep of two configurations, seeds pooled, whose budget cannot resolve what it is asked to."""
    from helpers import mlflow_runs, sweep_cli

    tmp = tmp_path_factory.mktemp("answer")
    done = sweep_cli(tmp, "backend=numpy", "dtype=float32,float64", "seed=0,1", "timing.resolve=0.001")
    assert done.returncode == 0, done.stderr[-3000:]
    (parent,), _ = mlflow_runs(tmp)
    return tmp, done, parent


def test_the_terminal_says_the_warnings_a_sweep_kept_wherever_its_rounds_ran(tmp_path, caplog):
    """Issue 78: a SLURM sweep's 'out of budget' was logged on its node and kept in sweep.json: summary.md and the
    parent's description said it, the terminal never did. The end of a sweep prints what summary.md says."""
    import logging

    from runner.record.sweep_file import write_sweep_file

    kept = "out of budget: a comparison resolves nothing (rounds disagree) after 28 rounds (timing.resolve=0.1)"
    write_sweep_file(tmp_path, {"overrides": [], "warnings": [kept]})
    frame = sweep({"numpy": 18e-6, "torch": 29e-6})
    with caplog.at_level(logging.WARNING):
        sweep_summary.print_table(frame, tmp_path)
    said = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert said == sweep_summary.sweep_warnings(frame, tmp_path) and said[0] == kept


def test_the_parent_says_how_to_read_it_draws_the_comparison_and_warns_as_the_terminal_did(tracked):
    """The parent's description (issue 48): the sentence, a link to how to read it, the configurations' table, the
    chart of time / the fastest with its intervals, and the sweep's warnings once, as the terminal printed them."""
    from mlflow.tracking import MlflowClient

    tmp, done, parent = tracked
    run_id, experiment_id = parent.info.run_id, parent.info.experiment_id
    description = parent.data.tags["mlflow.note.content"]
    sentence, pointers, table = description.split("\n\n")[:3]
    assert sentence == f"**{parent.data.tags['verdict']}**" and "the sizes known" in sentence
    guide = f"#/experiments/{experiment_id}/runs/{run_id}/artifacts/how-to-read.md?workflowType=machine_learning"
    assert f"[how to read this]({guide})" in pointers
    assert "the chart under the table" in pointers and "warning" in pointers
    assert table.startswith("| configuration |")
    chart = f"(get-artifact?path=report%2Fspeedup.png&run_uuid={run_id})"
    assert description.index(chart) > description.index(table) > 0
    printed = [line for line in done.stderr.splitlines() if line.startswith("warning: ")]
    # a quiet machine cannot resolve 0.1% in the budget; a loaded one warns that it was busy (its rounds may disagree)
    warned = ("warning: out of budget: a comparison resolves only", "warning: busy machine")
    assert any(line.startswith(warned) for line in printed), done.stderr[-2000:]
    for line in printed:  # each once, after the chart, before the command
        assert description.count(line) == 1, line
        assert description.index(chart) < description.index(line) < description.index("`python run.py -m")
    client = MlflowClient(f"sqlite:///{tmp}/mlflow.db")
    artifacts = {a.path for a in client.list_artifacts(run_id)} | {
        a.path for a in client.list_artifacts(run_id, "report")
    }
    assert {"how-to-read.md", "summary.md", "report/speedup.png"} <= artifacts
    guide = client.download_artifacts(run_id, "how-to-read.md", str(tmp))
    assert sweep_summary.HOW_TO_READ in open(guide).read()
    summary = (tmp / "sweep" / "summary.md").read_text()
    # summary.md carries the same warnings, no more (a SLURM sweep's 'out of budget' reached summary.md alone: its
    # rounds ran on the nodes, whose logs are no terminal)
    assert [line.rstrip() for line in summary.splitlines() if line.startswith("warning: ")] == printed


def test_an_unstable_configuration_gets_no_ratio_and_the_answer_opens_with_no_reliable_order():
    """Issue 62: 'jax fastest (7.05 ms a step); torch 2.49x (unstable)' opened on a winner and gave a ratio its
    disagreeing rounds did not support."""
    numpy, torch, jax = pool(sweep({"numpy": 1e-5, "torch": 3e-5, "jax": 9e-5}))
    why = "rounds 1-10 at 536 µs, 11-33 at 106 ms"
    torch = replace(torch, comparison=replace(torch.comparison, verdict=Verdict.UNSTABLE, reason=why))
    said = sweep_answer.sentence([numpy, torch, jax])
    assert said.startswith(
        f"no reliable order (torch's measurements disagree: {why}; quiet the machine, or pin each job: threads=1): "
        f"numpy {format_seconds(numpy.time_s)}; torch {format_seconds(torch.time_s)}, unstable; jax "
    )
    assert "fastest" not in said and f"{format_ratio(torch.ratio)}" not in said
    no_interval = {"low": math.nan, "high": math.nan, "verdict": Verdict.CANNOT_TELL, "reason": "1 round"}
    one_round = replace(jax, comparison=replace(jax.comparison, **no_interval))
    said = sweep_answer.sentence([numpy, pool(sweep({"numpy": 1e-5, "torch": 3e-5}))[1], one_round])
    assert said.startswith("no reliable order (jax: 1 round): numpy ") and "(cannot tell)" in said


def test_where_under_two_have_samples_enough_the_answer_opens_with_not_enough_samples():
    """Issue 77: a busy train-step sweep opened on 'no reliable order (jax unstable ...; torch not enough samples (2))':
    with one configuration left to rank, what is missing is time, and the opening says so."""
    jax, torch = pool(sweep({"jax": 1e-5, "torch": 3e-5}))
    few = {"low": math.nan, "high": math.nan, "verdict": Verdict.CANNOT_TELL, "reason": "not enough samples (2)"}
    torch = replace(torch, comparison=replace(torch.comparison, ranked=False, **few))
    jax = replace(jax, comparison=replace(jax.comparison, verdict=Verdict.UNSTABLE, reason="rounds 1-9 at 1 ms"))
    said = sweep_answer.sentence([jax, torch])
    assert said.startswith("not enough samples for an order (jax's measurements disagree: rounds 1-9 at 1 ms; ")
    assert said.endswith(f"torch {format_seconds(torch.time_s)}, not enough samples (2)")


def test_a_resolution_beyond_100_percent_is_said_as_the_factor_it_is():
    from runner.record.table import format_resolution

    assert format_resolution(0.225) == "22.5%"
    assert format_resolution(8.987) == "a 9.99x difference"  # 'resolves only 898.7%' read as no resolution at all
    assert format_resolution(math.inf) == ""


def test_the_tables_name_the_host_where_the_runs_ran_on_several():
    """Issue 78: no table said where a run ran; a cluster's blocks ran on several nodes."""
    from runner import report

    one_host = sweep({"numpy": 18e-6, "torch": 30e-6}).assign(host="node-1")
    assert "host" not in report.human_table(one_host)[0] and "host" not in report.table(one_host)
    nodes = one_host.assign(host=["node-1", "node-2", "node-1", "node-2"])
    headers, cells = report.human_table(nodes)
    assert headers[:3] == ["run", "status", "host"]
    assert [row[2] for row in cells] == ["node-1", "node-2", "node-1", "node-2"]
    assert list(report.table(nodes)["host"]) == ["node-1", "node-2", "node-1", "node-2"]


def test_the_job_table_of_summary_md_and_the_description_names_the_host_where_the_runs_ran_on_several():
    """Issue 78: a sweep on 3 SLURM nodes showed each job's node on the terminal and in runs.md, but summary.md's job
    table (the parent run's description's too) did not; on one host it shows none, as the other tables."""
    one_host = sweep({"numpy": 18e-6, "torch": 30e-6}).assign(host="node-1")
    assert "host" not in sweep_answer.job_table(one_host)[0]
    nodes = one_host.assign(host=["node-1", "node-2", "node-1", "node-2"])
    headers, cells = sweep_answer.job_table(nodes)
    assert headers[:3] == ["job", "status", "host"]
    assert [row[2] for row in cells] == ["node-1", "node-2", "node-1", "node-2"]
    assert "| numpy · seed=1 #1 | FINISHED | node-2 |" in sweep_answer.answer(nodes).details

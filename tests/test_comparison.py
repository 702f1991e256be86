"""The one comparison (runner.report.comparison): every table, page and metric that compares runs says the same figure,
names its baseline, and comes from one place."""

from __future__ import annotations

import ast
import dataclasses
import math

import numpy as np
import pytest
from test_pooled import sweep

from runner.config import PROJECT_ROOT
from runner.identity import work
from runner.record.table import format_interval, format_ratio, format_seconds, ratio_figure
from runner.report import compare, pooled, sweep_answer
from runner.report.comparison import Comparison, Verdict, versus_fastest
from runner.report.comparison import compare as compare_two
from runner.report.ratio import Job
from runner.report.timings import MIN_RANK_SAMPLES, Timings


def test_a_configuration_of_one_run_shows_the_same_figure_in_every_table_and_metric():
    frame = sweep({"numpy": 18e-6, "torch": 18e-6 * 1.04, "jax": 18e-6 * 23}, seeds=1)
    headers, cells = sweep_answer.table_cells(pooled.pool(frame))
    by_label = {row[0]: row for row in cells}
    jobs = compare(frame)
    parent = sweep_answer.metrics(pooled.pool(frame))
    for _, job in jobs.iterrows():
        row = by_label[job["params.backend.name"]]
        assert row[headers.index("time / fastest configuration")] == format_ratio(job["time_ratio"])
        assert row[headers.index("95% interval")] == format_interval(
            (job["time_ratio_ci_low"], job["time_ratio_ci_high"])
        )
        assert parent[f"{job['params.backend.name']}.time_ratio"] == ratio_figure(job["time_ratio"])  # = the child's
    job_headers, _ = sweep_answer.job_table(frame)
    assert "time / fastest job" in job_headers  # each table names its baseline


def test_printed_ratios_keep_three_figures_and_the_recorded_metric_is_the_printed_one():
    assert [format_ratio(v) for v in (1.0345146, 22.6802684, 253.4)] == ["1.03x", "22.7x", "253x"]
    assert ratio_figure(0.9635894394863045) == 0.96 and ratio_figure(22.6802684) == 22.7
    assert format_interval((21.51, 23.91)) == "21.5–23.9x" and format_interval((math.nan, math.nan)) == ""


@pytest.mark.parametrize(
    ("other", "same"),
    [
        ({"backend.name": "torch", "mode.name": "function", "dtype": "float64"}, True),  # what a comparison is for
        ({"model.method": "reshape"}, True),  # a named alternative
        ({"seed": "3", "timing.max_time_s": "5"}, True),
        ({"model.n": "2048"}, False),  # a size is other work
        ({"batch_size": "64"}, False),
        ({"task.name": "inference"}, False),
    ],
)
def test_the_same_work_is_model_task_batch_and_numeric_settings(other, same):
    base = {"model.name": "reshape", "task.name": "gradients", "batch_size": 32, "model.n": 64}
    base |= {"backend.name": "numpy", "mode.name": "eager", "model.method": "view", "seed": 0}
    assert (work(base) == work(base | other)) is same


def test_params_as_mlflow_returns_them_make_the_same_key_as_the_config():
    assert work({"model.name": "matmul", "batch_size": 32, "model.n": 64.0}) == work(
        {"model.name": "matmul", "batch_size": "32", "model.n": "64", "model.pretrained": "False"}
    )


def test_the_verdict_reads_the_same_everywhere():
    assert Comparison(1.2, 1.1, 1.3, Verdict.SLOWER).words() == "slower"
    assert Comparison(1.2, math.nan, math.nan, Verdict.CANNOT_TELL, "1 round").words() == "cannot tell (1 round)"
    assert Comparison(3.0, math.nan, math.nan, Verdict.UNSTABLE, "rounds 1-4 at 1 ms").words().startswith("unstable: ")


def test_a_job_that_took_one_turn_is_the_one_named_short_of_rounds():
    """A sweep's fastest took one turn (its budget spent in round 1) while jax took 33: 'jax: 1 round' read as if
    jax had one round. The reason names the side whose rounds were too few."""
    rng = np.random.default_rng(0)
    many = np.repeat(np.arange(1, 34), 3)
    jax = Timings((Job(2e-3 * np.exp(rng.normal(0, 0.01, many.size)), many),))
    torch = Timings((Job(1e-3 * np.exp(rng.normal(0, 0.01, 12)), np.ones(12, dtype=int)),))
    assert compare_two(torch, jax).reason == "1 round"  # torch's own
    _, found = versus_fastest([torch, jax], ["torch", "jax"])
    assert found.verdict == Verdict.CANNOT_TELL and found.words() == "cannot tell (the fastest took 1 round)"
    fastest, slower = pooled.pool(sweep({"torch": 1e-3, "jax": 2e-3}))
    slower = dataclasses.replace(slower, label="jax", comparison=found)
    assert sweep_answer.sentence([fastest, slower]).startswith("no reliable order (jax: the fastest took 1 round): ")


def _one_run(rng, seconds: float, busy: float = 0.0) -> Timings:
    rounds = np.repeat(np.arange(1, 11), 3)
    samples = seconds * np.exp(rng.normal(0, 0.01, rounds.size))
    return Timings((Job(samples, rounds),), (float(np.median(samples)),), busy)


def test_runs_measured_apart_on_a_busy_machine_are_not_called_slower():
    rng = np.random.default_rng(0)
    quiet = compare_two(_one_run(rng, 1.5e-3), _one_run(rng, 1e-3), apart=True)
    busy = compare_two(_one_run(rng, 1.5e-3, busy=2.0), _one_run(rng, 1e-3), apart=True)
    assert quiet.verdict == Verdict.SLOWER and quiet.ratio == pytest.approx(1.5, rel=0.02)
    assert busy.verdict == Verdict.CANNOT_TELL and "busy" in busy.reason


def test_a_change_under_the_factor_is_no_change_and_over_it_slower():
    rng = np.random.default_rng(1)
    before, after = _one_run(rng, 1e-3), _one_run(rng, 1.15e-3)
    assert compare_two(after, before, apart=True, factor=1.2).words() == "no change (under 1.20x)"
    assert compare_two(after, before, apart=True, factor=1.1).verdict == Verdict.SLOWER


def test_no_module_but_the_comparison_computes_a_ratio_against_a_baseline():
    """The statistics (ratio.time_ratio) and the choice of the fastest (versus_fastest) are called from
    runner.report.comparison only; every other module asks it."""
    source = PROJECT_ROOT / "src" / "runner"
    callers = set()
    for path in source.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", "")) == "time_ratio":
                callers.add(path.relative_to(source).as_posix())
    assert callers == {"report/comparison.py"}


def test_a_ratio_outside_the_interval_of_the_typical_times_beside_it_gets_no_verdict():
    """A page shows a run's typical time (the median over its rounds) beside its ratio (the geometric mean over its
    rounds): where the typical times' ratio falls outside the ratio's interval, the two figures contradict each other
    and neither is given as the answer (seen on a busy machine: 6.53x [5.67-7.52] beside typical times 7.54x apart)."""
    rounds = np.arange(1, 25)
    skewed = np.tile([1.0, 1.0, 1.6], 8)  # every third round slow: median 1.0, geometric mean 1.17
    run, baseline = Timings((Job(skewed * 1e-3, rounds),)), Timings((Job(np.full(24, 1e-3), rounds),))
    found = compare_two(run, baseline)
    assert run.typical_s() / baseline.typical_s() == pytest.approx(1.0)
    assert found.verdict == Verdict.UNSTABLE and math.isnan(found.low)
    assert found.reason == "1.17x over its rounds, 1.00x by the typical times"
    steady = Timings((Job(np.full(24, 1.17e-3), rounds),))  # the same geometric mean, every round alike
    assert compare_two(steady, baseline).verdict == Verdict.SLOWER


def _one_generation(rng: np.random.Generator, per_token_s: float, tokens: int = 15) -> Timings:
    """A job of one round: one generation, its decode steps timed one by one (noise: 5% a token, 1 in 15 stalled
    2-3x, and the worker process's own offset, ratio.PROCESS_SD), its first token and whole time beside them."""
    offset = np.exp(rng.normal(0, 0.012))
    steps = per_token_s * offset * np.exp(rng.normal(0, 0.05, tokens))
    steps *= np.where(rng.random(tokens) < 1 / 15, rng.uniform(2, 3, tokens), 1.0)
    whole = 4 * per_token_s * np.exp(rng.normal(0, 0.3)) + steps.sum()  # its first token stalls as it likes
    return Timings((Job(np.array([whole]), np.array([1]), np.array([0])),), parts=(steps[None, :],))


def test_with_one_generation_each_the_decode_steps_give_the_interval():
    """At a decoder's real size one generation fills the budget: one round, no interval over rounds. The decode steps
    compare instead, paired by position: identical jobs are called different about 1 time in 20 (at 95%), a 1.3x
    slower decode nearly always, and the ratio is of a token's time, whatever the first tokens did."""
    rng = np.random.default_rng(7)
    pairs = 400
    same = [compare_two(_one_generation(rng, 0.1), _one_generation(rng, 0.1)) for _ in range(pairs)]
    assert all(c.of_parts and c.basis == "1 round x 15 parts of a call" for c in same)
    called = sum(c.verdict in (Verdict.SLOWER, Verdict.FASTER) for c in same)
    assert called <= 0.08 * pairs  # 5% expected: 20 of 400, binomial sd 4.4
    slower = [compare_two(_one_generation(rng, 0.13), _one_generation(rng, 0.1)) for _ in range(pairs)]
    assert sum(c.verdict == Verdict.SLOWER for c in slower) >= 0.95 * pairs
    assert 1.2 < np.median([c.ratio for c in slower]) < 1.4


def test_calls_whose_parts_were_not_observed_get_no_interval_from_them():
    """keras_hub's generate() returns its tokens at the end: its per-token rows are NaN; one round stays one round."""
    rng = np.random.default_rng(1)
    unobserved = Timings((Job(np.array([1.5]), np.array([1]), np.array([0])),), parts=(np.full((1, 15), np.nan),))
    found = compare_two(unobserved, _one_generation(rng, 0.1))
    assert found.verdict == Verdict.CANNOT_TELL and not found.of_parts and math.isnan(found.low)


def _generations(rng: np.random.Generator, per_token_s: float, busy: float = 0.0) -> Timings:
    """A job of MIN_RANK_SAMPLES rounds, one generation a round (_one_generation's), in one worker process."""
    each = [_one_generation(rng, per_token_s) for _ in range(MIN_RANK_SAMPLES)]
    rounds = np.arange(1, MIN_RANK_SAMPLES + 1)
    whole = np.array([t.replicates[0].seconds[0] for t in each])
    steps = np.vstack([t.parts[0] for t in each])
    return Timings((Job(whole, rounds, np.zeros(len(rounds), dtype=int)),), busy=busy, parts=(steps,))


def test_a_few_generations_each_on_a_busy_machine_are_cannot_tell():
    """Each job's tokens came from its own turns: what else ran in the other's turns is beyond them (identical jobs
    read 0.70x [0.61-0.81] beside other work), so on a busy machine a difference they show is not called."""
    rng = np.random.default_rng(3)
    slower, fast = _generations(rng, 0.13), _generations(rng, 0.1)
    busy = compare_two(Timings(slower.replicates, busy=1.5, parts=slower.parts), fast)
    assert busy.verdict == Verdict.CANNOT_TELL and busy.reason.startswith("looks slower, but the machine was busy")
    assert compare_two(slower, fast).verdict == Verdict.SLOWER
    far = _generations(rng, 0.3, busy=1.5)  # 3x: beyond what load alone made of a call here (BUSY_FACTOR)
    assert compare_two(far, fast).verdict == Verdict.SLOWER


def test_one_generation_on_a_busy_machine_is_not_ranked():
    """Issue 77: a busy gpt2 sweep gave torch's one generation 0.17x a token [0.00-7.52] and ranked it, beside its
    1.64 s a generation against jax's 164 ms. The parts of one call share its turn: on a busy machine they do not
    count as samples, and a job of fewer whole calls than MIN_RANK_SAMPLES is listed, not ranked; quiet, it is."""
    rng = np.random.default_rng(5)
    one, others = _one_generation(rng, 0.1), _one_generation(rng, 0.1)
    busy = Timings(one.replicates, busy=1.5, parts=one.parts)
    assert busy.too_few() == (
        "not enough samples (1 call; on a busy machine a call's parts do not count: 1.5 other runnable)"
    )
    found = compare_two(busy, others)
    assert (found.verdict, found.ranked, math.isnan(found.low)) == (Verdict.CANNOT_TELL, False, True)
    assert one.ranked() and compare_two(one, others).ranked


def test_runs_made_apart_are_compared_apart_whatever_their_hosts_are_called():
    """Two single runs made by separate commands minutes apart share no rounds: round k of one and round k of the
    other name no common moment. Under one host name or two, they get the same unpaired interval, the machine's
    drift between runs in it; two jobs of one sweep on one host are paired (issue 78)."""
    frame = sweep({"numpy": 18e-6, "torch": 18e-6 * 1.2}, seeds=1)

    def torch_row(hosts: list[str], timed_in: list[str]):
        frame["host"], frame["timed_in"] = hosts, timed_in
        return compare(frame).set_index("params.backend.name").loc["torch"]

    paired = torch_row(["vm-1", "vm-1"], ["/sweep|vm-1|", "/sweep|vm-1|"])
    one_name = torch_row(["vm-1", "vm-1"], ["run-a|vm-1|", "run-b|vm-1|"])  # two single runs: each its own rounds
    two_names = torch_row(["vm-1", "vm-2"], ["run-a|vm-1|", "run-b|vm-2|"])
    assert paired["time_ratio_basis"] == "20 rounds"
    assert one_name["time_ratio_basis"] == two_names["time_ratio_basis"] == "20 rounds, unpaired"
    interval = ["time_ratio", "time_ratio_ci_low", "time_ratio_ci_high"]
    assert one_name[interval].tolist() == two_names[interval].tolist()
    width = {
        name: row["time_ratio_ci_high"] / row["time_ratio_ci_low"]
        for name, row in (("paired", paired), ("apart", one_name))
    }
    assert width["apart"] > width["paired"]


def busy_job(rng: np.random.Generator, seconds: float, rounds: int = 39, per_turn: int = 5) -> Job:
    """A job's samples on a machine another user keeps busy: in 40% of its turns every call runs 2-20x slower (its
    rounds spread far past UNSTABLE_SPREAD), its process a lasting offset of its own."""
    offset = math.exp(rng.normal(0, 0.012))
    slow = np.where(rng.random(rounds) < 0.4, np.exp(rng.uniform(math.log(2), math.log(20), rounds)), 1.0)
    numbers = np.repeat(np.arange(1, rounds + 1), per_turn)
    samples = seconds * offset * np.repeat(slow, per_turn) * np.exp(rng.normal(0, 0.02, len(numbers)))
    return Job(samples, numbers)


def test_on_a_busy_machine_the_paired_rounds_still_order_a_5x_difference_and_never_identical_jobs():
    """Issue 77: every round of a train-step sweep agreed (39 of 39) on an order the answer withheld, because one
    job's rounds spread 7x. The rounds' sign test orders a 5x difference with a bound that holds under the load, and
    calls identical jobs different no more often than its level."""
    ordered, aa_ordered, bounds = 0, 0, []
    for seed in range(20):
        rng = np.random.default_rng(seed)
        fast, slow, same = (Timings((busy_job(rng, s),)) for s in (1e-3, 5e-3, 1e-3))
        assert fast.instability() and slow.instability()  # no interval over the rounds: they disagree
        baseline, other = versus_fastest([slow, fast], ["slow", "fast"])
        if other.verdict == Verdict.FASTEST and baseline.verdict == Verdict.SLOWER:
            ordered += 1
            bounds.append(baseline.low)
            assert "paired rounds, at least" in baseline.reason and baseline.basis == "39 rounds, sign test"
        a, b = versus_fastest([fast, same], ["a", "b"])
        aa_ordered += Verdict.SLOWER in (a.verdict, b.verdict)
    assert ordered >= 18 and aa_ordered <= 1
    assert all(1 < low < 5 for low in bounds)  # a bound that holds the truth


def test_a_job_with_too_few_samples_is_listed_never_ranked_or_drawn(tmp_path):
    """Issue 77: a generation timed once (its warm-up cut short) came out 0.36x a token [0.01-21.5] and was drawn
    left of the fastest. A job with fewer samples than MIN_RANK_SAMPLES says so, is never the fastest, and has no
    bar on the chart."""
    from runner.report.plots import plot_speedups

    frame = sweep({"numpy": 18e-6, "torch": 9e-6, "jax": 18e-6 * 3}, seeds=1)
    torch = frame.index[frame["params.backend.name"] == "torch"][0]
    frame.at[torch, "samples_s"] = frame.at[torch, "samples_s"][: MIN_RANK_SAMPLES - 1]
    frame.at[torch, "sample_rounds"] = frame.at[torch, "sample_rounds"][: MIN_RANK_SAMPLES - 1]
    found = pooled.pool(frame)
    assert [p.label for p in found] == ["numpy", "jax", "torch"]  # the fastest by its time is not ranked first
    assert found[0].verdict == Verdict.FASTEST and found[1].verdict == Verdict.SLOWER
    assert found[2].verdict == Verdict.CANNOT_TELL and found[2].reason == f"not enough samples ({MIN_RANK_SAMPLES - 1})"
    assert math.isnan(found[2].low) and not found[2].comparison.ranked
    said = sweep_answer.sentence(found)
    assert said.startswith("numpy fastest") and f"; torch {format_seconds(found[2].time_s)}, not enough" in said
    assert plot_speedups(frame, tmp_path / "speedup.png").exists()

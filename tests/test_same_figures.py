"""One busy sweep, read everywhere a person meets its figures (issue 77, "the same figures agree"): the parent run's
metrics and description in MLflow, the report's runs.csv, and what speedup.png and time_per_config.png draw. Each
shows the statistic the answer uses (the typical time, and time / the fastest's typical time) in the answer's order,
or names the other statistic it shows (the median of all samples) as what it is.

The sweep: numpy steady; torch 5x numpy in its fastest block of a turn, but stalled in 3 of its 5 blocks of most
turns (its median of all samples about 30x) and in whole turns now and then, so that its rounds spread and the sign
test over the paired rounds orders it; jax a steady 10x. Its medians order numpy, jax, torch; its typical times
numpy, torch, jax. The test made before the fix found time_per_config.png ordered by the medians with no mark of the
typical time: torch's box at 29x beside speedup.png's 5x."""

from __future__ import annotations

import re

import numpy as np
import pandas as pd
import pytest
from helpers import identified, made_store

from runner.measure.samples import typical_s
from runner.record.table import format_ratio, format_seconds, ratio_figure
from runner.report import plots, pooled, sweep_answer, write_report
from runner.report.comparison import Verdict

ROUNDS, PER_ROUND = 20, 5
NUMPY_S = 1e-4
TYPICAL = {"numpy": 1.0, "torch": 5.0, "jax": 10.0}  # each one's typical time over numpy's, as made
ORDER = ["numpy", "torch", "jax"]  # by the typical times: the answer's order


def _samples(backend: str, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    rounds = np.repeat(np.arange(1, ROUNDS + 1), PER_ROUND)
    samples = NUMPY_S * TYPICAL[backend] * np.exp(rng.normal(0, 0.01, rounds.size))
    if backend == "torch":
        position = np.tile(np.arange(PER_ROUND), ROUNDS)
        samples[position >= 2] *= 6  # lost its core in 3 of 5 blocks a turn: the median moves, not the fastest
        samples[np.isin(rounds, [3, 6, 9, 12, 15, 18])] *= 10  # ... and whole turns: its rounds spread 10x
    return samples, rounds


def busy_sweep() -> pd.DataFrame:
    """Three jobs of one sweep as runner.report.frame reads them from their records (seed 0 each: a configuration
    is one job, so the jobs' table and the configurations' say the same)."""
    rng = np.random.default_rng(7)
    rows = []
    for i, backend in enumerate(ORDER):
        samples, rounds = _samples(backend, rng)
        rows.append(
            {
                "run": f"{backend} · seed=0",
                "run_dir": f"/sweep/{i}",
                "status": "FINISHED",
                "params.model.name": "mlp",
                "params.task.name": "gradients",
                "params.batch_size": 32,
                "params.backend.name": backend,
                "params.seed": 0,
                "metrics.time_median_s": float(np.median(samples)),  # as the job's record has them
                "metrics.time_typical_s": typical_s(samples, rounds),
                "metrics.time_iqr_s": float(np.subtract(*np.percentile(samples, [75, 25]))),
                "metrics.machine_other_runnable": 6.0,
                "samples_s": samples,
                "sample_rounds": rounds,
                "size": np.nan,
                "size_name": None,
            }
        )
    return identified(pd.DataFrame(rows))


def _number(cell: str) -> float:
    """'5.03x' or '503\u00a0µs' as a number (in the cell's own unit)."""
    return float(re.sub(r"[^\d.]", "", cell.split("\u00a0")[0].split(" ")[0]))


def _table(text: str, first_header: str) -> tuple[list[str], list[list[str]]]:
    """The markdown table in `text` whose first heading is `first_header`: its headings and cells."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"| {first_header} |"))
    rows = []
    for line in lines[start:]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip().strip("|").split("|")])
    return rows[0], [row for row in rows[2:]]


def _seconds(cell: str) -> float:
    value = _number(cell)
    unit = cell.replace("\u00a0", " ").split(" ")[-1]
    return value * {"s": 1, "ms": 1e-3, "µs": 1e-6, "ns": 1e-9}[unit]


@pytest.fixture(scope="module")
def read(tmp_path_factory):
    """The sweep's figures as each place shows them: the parent's metrics and description (logged to a real MLflow
    store by the code that closes a sweep's parent), runs.csv, and the figures the two plots save."""
    from mlflow.tracking import MlflowClient

    from runner import tracking

    tmp = tmp_path_factory.mktemp("same")
    frame = busy_sweep()
    plt = plots._pyplot()
    drawn = {}
    original = plt.Figure.savefig
    plt.Figure.savefig = lambda fig, path, *a, **k: (
        drawn.update({str(path).rsplit("/", 1)[-1]: fig}) or original(fig, path, *a, **k)
    )
    try:
        files = write_report(frame, tmp / "report")
    finally:
        plt.Figure.savefig = original
    info = {"uri": made_store(tmp), "experiment": "busy", "sweep_dir": str(tmp), "launcher": "rounds"}
    info |= {"overrides": ["backend=numpy,torch,jax"]}
    info["parent_run_id"] = tracking.create_parent_run(info)
    tracking.close_parent_run(info, {"n_jobs": 3}, files, "FINISHED", sweep_answer.answer(frame))
    parent = MlflowClient(info["uri"]).get_run(info["parent_run_id"])
    return frame, parent, pd.read_csv(tmp / "report" / "runs.csv"), drawn


def test_the_sweep_is_busy_its_rounds_disagree_and_the_sign_test_orders_it(read):
    frame = read[0]
    found = pooled.pool(frame)
    assert [p.label for p in found] == ORDER
    torch = found[1]
    assert torch.verdict == Verdict.SLOWER and "paired rounds, at least" in torch.reason  # the sign test decided
    assert torch.ratio == pytest.approx(TYPICAL["torch"], rel=0.05)
    medians = frame.set_index("params.backend.name")["metrics.time_median_s"]
    assert medians["torch"] / medians["numpy"] > 4 * torch.ratio  # the medians tell another story here


def test_the_parents_metrics_give_the_answers_ratios(read):
    frame, parent, _, _ = read
    metrics = parent.data.metrics
    for p in pooled.pool(frame):
        assert metrics[f"{p.key}.time_ratio"] == pytest.approx(p.ratio, rel=1e-3)
        assert metrics[f"{p.key}.time_typical_us"] == pytest.approx(p.time_s * 1e6, rel=1e-3)
    assert metrics["slowest.time_ratio"] == pytest.approx(metrics["jax.time_ratio"])
    assert metrics["next_fastest.time_ratio"] == pytest.approx(metrics["torch.time_ratio"])
    assert sorted(ORDER, key=lambda b: metrics[f"{b}.time_ratio"]) == ORDER
    assert parent.data.tags["fastest"] == "numpy"


def test_the_description_gives_the_answers_ratios_and_names_the_median_as_the_median(read):
    frame, parent, _, _ = read
    description = parent.data.tags["mlflow.note.content"]
    ratios = {p.label: p.ratio for p in pooled.pool(frame)}
    headers, rows = _table(description, "configuration")
    assert headers[2:4] == ["time / call", "time / fastest configuration"]
    assert [row[0] for row in rows] == ORDER
    for row in rows:
        assert _number(row[3]) == pytest.approx(ratios[row[0]], rel=5e-3)
        fastest = _seconds(rows[0][2])
        assert _seconds(row[2]) / fastest == pytest.approx(ratios[row[0]], rel=0.01)  # the times beside agree
    headers, jobs = _table(description, "job")
    column = {name: i for i, name in enumerate(headers)}
    assert {"median", "typical", "time / fastest job"} <= set(column)  # the median said as the median
    by_job = {row[0].split(" ")[0]: row for row in jobs}
    for backend in ORDER:
        row = by_job[backend]
        assert _number(row[column["time / fastest job"]]) == pytest.approx(ratios[backend], rel=5e-3)
        over = _seconds(row[column["typical"]]) / _seconds(by_job["numpy"][column["typical"]])
        assert over == pytest.approx(ratios[backend], rel=0.01)


def test_the_report_csv_gives_the_answers_ratios_beside_the_typical_times(read):
    frame, _, csv, _ = read
    ratios = {p.label: p.ratio for p in pooled.pool(frame)}
    csv = csv.set_index("backend")
    assert list(csv.sort_values("time_ratio").index) == ORDER
    for backend in ORDER:
        assert csv.loc[backend, "time_ratio"] == pytest.approx(ratios[backend], rel=1e-6)
        over = csv.loc[backend, "time_typical_s"] / csv.loc["numpy", "time_typical_s"]
        assert over == pytest.approx(ratios[backend], rel=0.01)  # paired rounds' mean: within noise of it
    assert csv.loc["torch", "verdict"] == Verdict.SLOWER


def test_speedup_png_draws_the_answers_ratios(read):
    frame, _, _, drawn = read
    found = pooled.pool(frame)
    ax = drawn["speedup.png"].axes[0]
    assert [t.get_text() for t in ax.get_yticklabels()] == ORDER
    ends = [bar.get_x() + bar.get_width() for bar in ax.patches]
    assert ends == pytest.approx([p.ratio for p in found])


def test_the_time_plot_marks_the_typical_times_in_the_answers_order_and_names_its_boxes(read):
    """Its boxes are of every sample (the median torch's stalls moved); the typical times are marked on them, in the
    answer's order, and the axis and legend say which is which."""
    frame, _, _, drawn = read
    ratios = {p.label: p.ratio for p in pooled.pool(frame)}
    fig = drawn["time_per_config.png"]
    ax = fig.axes[0]
    labels = [t.get_text() for t in ax.get_yticklabels()]
    assert [label.removeprefix("backend=") for label in labels] == ORDER
    (typical,) = [line for line in ax.get_lines() if line.get_label().startswith("typical")]
    x, y = typical.get_xdata(), typical.get_ydata()
    assert list(y) == [0, 1, 2]
    assert [value / x[0] for value in x] == pytest.approx([ratios[b] for b in ORDER], rel=0.01)
    said = ax.get_xlabel() + " " + " ".join(t.get_text() for t in ax.get_legend().get_texts())
    assert "typical" in said and "what time / fastest compares" in said and "median" in said


def _generation(backend: str, token_s: float, stalled: bool, rng: np.random.Generator, i: int) -> dict:
    """A job of a generation sweep too long for rounds (2 rounds of 3 generations, 15 decode steps each): where
    `stalled`, 2 of each 3 consecutive tokens lost their core 20x (the median token moves, a block's fastest not)."""
    rounds = np.repeat([1, 2], 3)
    parts = token_s * np.exp(rng.normal(0, 0.01, (rounds.size, 15)))
    if stalled:
        parts[:, np.arange(15) % 3 != 2] *= 20
    samples = 5 * token_s + parts.sum(axis=1)  # a prefill, then the tokens
    return {
        "run": f"{backend} · seed=0",
        "run_dir": f"/sweep/{i}",
        "status": "FINISHED",
        "params.model.name": "gpt2",
        "params.task.name": "generate",
        "params.batch_size": 32,
        "params.backend.name": backend,
        "params.seed": 0,
        "metrics.time_median_s": float(np.median(samples)),
        "metrics.time_typical_s": typical_s(samples, rounds),
        "metrics.tpot_p50_s": float(np.median(parts)),  # as the job's record has it: the median of every token
        "metrics.machine_other_runnable": 0.2,
        "samples_s": samples,
        "sample_rounds": rounds,
        "sample_parts": parts,
        "size": np.nan,
        "size_name": None,
    }


def test_a_ratio_a_token_stands_beside_the_typical_token_and_the_median_is_said_so():
    """Seen on a busy machine (issue 77's generation sweep): 'jax fastest (175 ms a generation, 10.6 ms a token);
    numpy 0.17x a token [0.15-0.20]' above a table giving numpy 32 ms per token: the ratio compares the tokens' typical
    time (each block's fastest), the table gave the median of every token. The sentence and the configurations' table
    now give the typical token; the jobs' table heads its median as the median."""
    rng = np.random.default_rng(3)
    frame = identified(
        pd.DataFrame([_generation("numpy", 1.5e-3, True, rng, 0), _generation("jax", 1e-2, False, rng, 1)])
    )
    jax, numpy = found = pooled.pool(frame)
    assert jax.is_fastest and numpy.comparison.of_parts and numpy.verdict == Verdict.FASTER
    assert numpy.ratio == pytest.approx(0.15, rel=0.05)
    medians = frame.set_index("params.backend.name")["metrics.tpot_p50_s"]
    assert medians["numpy"] / medians["jax"] > 10 * numpy.ratio  # the median token tells another story
    assert numpy.part_s / jax.part_s == pytest.approx(numpy.ratio, rel=0.05)
    said = sweep_answer.sentence(found)
    assert f"jax fastest ({format_seconds(jax.time_s)} a generation, " in said
    assert f"{format_seconds(jax.part_s)} a token); numpy 0.15" in said
    headers, cells = sweep_answer.table_cells(found)
    column = headers.index("per token (typical)")
    tokens = {row[0]: _seconds(row[column]) for row in cells}
    assert tokens["numpy"] / tokens["jax"] == pytest.approx(numpy.ratio, rel=0.05)
    headers, _ = sweep_answer.job_table(frame)
    assert "per token (median)" in headers and "per token" not in headers
    metrics = sweep_answer.metrics(found)  # the parent's: the token's typical time beside the ratio a token
    assert metrics["numpy.time_ratio"] == ratio_figure(numpy.ratio)  # as the tables print it
    over = metrics["numpy.part_typical_us"] / metrics["jax.part_typical_us"]
    assert over == pytest.approx(metrics["numpy.time_ratio"], rel=0.05)
    plt = plots._pyplot()
    fig, ax = plt.subplots()
    plots._ratio_panel(ax, found, "gpt2 generate")
    assert [t.get_text() for t in ax.texts][
        1
    ] == f"{format_ratio(numpy.ratio)} a token {sweep_answer.interval_text(numpy)}"
    plt.close(fig)

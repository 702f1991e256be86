"""What a generation's tokens say beyond its times (issue 76): fidelity in distribution of a run below float64 against
float64's next-token distributions (KL mean / p99.9 / max, top-1 agreement, RMS Δp), and per-token percentiles with
their order-statistic intervals and a note where the tokens are too few to bound them."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from runner.config import compose
from runner.measure.job import run_and_record
from runner.record.naming import job_spec
from runner.tasks.generate import Generate
from runner.tasks.token_figures import fidelity, percentile_figures, percentile_interval, tokens_needed

FAST = ["timing.warmup_s=0", "timing.min_warmup_calls=1", "timing.min_repeats=2", "timing.max_time_s=0.05",
        "timing.rounds=1", "tracking=none"]  # fmt: skip


def test_fidelity_against_the_formulas_written_out():
    rng = np.random.default_rng(0)
    reference = rng.standard_normal((2, 3, 5))
    logits = reference + 0.3 * rng.standard_normal((2, 3, 5))
    tokens = rng.integers(0, 5, (2, 3))
    said = fidelity(logits, reference, tokens)
    kl, dp = [], []
    for b in range(2):
        for t in range(3):
            p = np.exp(reference[b, t]) / np.exp(reference[b, t]).sum()
            q = np.exp(logits[b, t]) / np.exp(logits[b, t]).sum()
            kl.append(sum(p[i] * math.log(p[i] / q[i]) for i in range(5)))
            dp.append(q[tokens[b, t]] - p[tokens[b, t]])
    assert said["kl_mean"] == pytest.approx(np.mean(kl), rel=1e-12)
    assert said["kl_max"] == pytest.approx(max(kl), rel=1e-12)
    assert said["kl_p999"] == pytest.approx(np.percentile(kl, 99.9), rel=1e-12)
    assert said["rms_dp"] == pytest.approx(math.sqrt(np.mean(np.square(dp))), rel=1e-12)
    agree = (logits.argmax(-1) == reference.argmax(-1)).mean()
    assert said["top1_agree_share"] == agree and 0 < agree < 1


def test_the_same_distribution_is_no_divergence_whatever_the_logits_offset():
    reference = np.random.default_rng(1).standard_normal((1, 4, 7))
    said = fidelity(reference + 3.0, reference, np.zeros((1, 4), int))
    assert said["kl_max"] == pytest.approx(0, abs=1e-15) and said["rms_dp"] == pytest.approx(0, abs=1e-15)
    assert said["top1_agree_share"] == 1.0


def test_a_percentiles_interval_is_between_the_order_statistics_the_binomial_picks():
    """Against scipy.stats.binom: the lower bound the highest order statistic reached at most 2.5% of the time, the
    upper the lowest reached at least 97.5%; a 15-token p99 is bounded only from below, by the 14th of 15."""
    from scipy.stats import binom

    values = np.random.default_rng(2).exponential(size=1000)
    ordered = np.sort(values)
    for q in (0.5, 0.9, 0.99):
        lower, upper = percentile_interval(values, q)
        below = int(binom.ppf(0.025, 1000, q))
        below -= binom.cdf(below, 1000, q) > 0.025
        assert lower == ordered[below]
        assert upper == ordered[int(binom.ppf(0.975, 1000, q))]
        assert lower < np.percentile(values, 100 * q) < upper
    lower, upper = percentile_interval(values[:15], 0.99)
    assert lower == np.sort(values[:15])[13] and math.isnan(upper)
    assert tokens_needed(0.99) == 368 and 0.99**367 > 0.025 >= 0.99**368


def test_a_15_token_p99_says_it_is_no_more_than_their_maximum():
    decode = np.arange(1, 16, dtype=float).reshape(1, 15) * 1e-3
    metrics, notes = percentile_figures(decode)
    assert "tpot_p99_hi_s" not in metrics and metrics["tpot_p99_lo_s"] == 14e-3
    assert metrics["tpot_p50_lo_s"] < metrics["tpot_p50_s"] < metrics["tpot_p50_hi_s"]
    assert notes == [
        "per token p90 13.6 ms rests on 15 tokens, too few to be more than their maximum: its 95% interval runs from "
        "11 ms, unbounded above; a bounded one needs 36 tokens (more task.new_tokens or samples)",
        "per token p99 14.9 ms rests on 15 tokens, too few to be more than their maximum: its 95% interval runs from "
        "14 ms, unbounded above; a bounded one needs 368 tokens (more task.new_tokens or samples)",
    ]
    lines = Generate.page_lines({"model": {"prompt_len": 16}, "task": {"new_tokens": 16}, "batch_size": 1}, metrics,
                                {}, lambda s: f"{s * 1e3:g} ms")  # fmt: skip
    assert "p99 14.86 ms [14 ms, unbounded]" in lines[1]


@pytest.mark.parametrize("dtype", ["bfloat16", "float64"])
def test_a_run_below_float64_records_its_distributions_fidelity(tmp_path, dtype):
    pytest.importorskip("torch")
    cfg = compose([*FAST, "model=llama", "task=generate", "task.new_tokens=16", "backend=torch", f"dtype={dtype}"])
    outcome = run_and_record(job_spec(cfg), tmp_path)
    assert outcome.status == "FINISHED", outcome.error
    saved = json.loads((tmp_path / "result.json").read_text())
    metrics = saved["metrics"]
    if dtype == "float64":
        assert "kl_mean" not in metrics
        return
    assert 0 < metrics["kl_mean"] <= metrics["kl_p999"] <= metrics["kl_max"] < 1
    assert 0.5 < metrics["top1_agree_share"] <= 1 and 0 < metrics["rms_dp"] < 0.1
    assert any(w.startswith("per token p99 ") and "368 tokens" in w for w in saved["warnings"])
    from runner.history.figures import recorded_figures

    fidelity_keys = {"kl_mean", "kl_p999", "kl_max", "top1_agree_share", "rms_dp"}
    assert fidelity_keys <= set(recorded_figures(metrics))  # each a series of runner history

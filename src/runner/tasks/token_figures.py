"""What a generation's tokens say beyond its times (task=generate):

- fidelity in distribution: how far a run below float64 moves each step's next-token distribution from float64's on the
  same sequence, as llama.cpp's perplexity tool reports a quantised model against its reference: the KL divergence
  KL(reference || run) per position (mean, p99.9, max), the share of positions whose top-1 token agrees, and RMS Δp,
  the root mean square of the change in probability of the sequence's next token (the token generated there);
- how far a per-token percentile can be trusted: its distribution-free 95% interval between two order statistics
  (the binomial count of tokens below the true percentile decides which), treating the tokens as independent draws.
  Where the tokens are too few for any order statistic to bound a percentile from above (p99 needs 368), the
  percentile is no more than their maximum, and a note says so.
"""

from __future__ import annotations

import math

import numpy as np

CONFIDENCE = 0.95
PERCENTILES = (("p50", 0.5), ("p90", 0.9), ("p99", 0.99))


def fidelity(logits: np.ndarray, reference: np.ndarray, tokens: np.ndarray) -> dict[str, float]:
    """logits (batch, steps, vocab) of the run, `reference` float64's on the same sequence, `tokens` (batch, steps) the
    token that follows each position: kl_mean, kl_p999, kl_max, top1_agree_share, rms_dp."""
    log_p, log_q = _log_softmax(np.asarray(reference, np.float64)), _log_softmax(np.asarray(logits, np.float64))
    p = np.exp(log_p)
    # where the reference gives a token no probability its term is 0, whatever the run's log q
    kl = np.maximum(np.sum(np.where(p > 0, p * (log_p - log_q), 0.0), axis=-1), 0.0)
    top1 = np.argmax(logits, axis=-1) == np.argmax(reference, axis=-1)
    following = tokens[..., None]
    dp = np.take_along_axis(np.exp(log_q), following, -1) - np.take_along_axis(p, following, -1)
    return {
        "kl_mean": float(kl.mean()),
        "kl_p999": float(np.percentile(kl, 99.9)),
        "kl_max": float(kl.max()),
        "top1_agree_share": float(top1.mean()),
        "rms_dp": float(np.sqrt(np.mean(dp**2))),
    }


def _log_softmax(x: np.ndarray) -> np.ndarray:
    shifted = x - x.max(axis=-1, keepdims=True)
    return shifted - np.log(np.sum(np.exp(shifted), axis=-1, keepdims=True))


def percentile_interval(values: np.ndarray, q: float) -> tuple[float, float]:
    """The 95% interval of the q-quantile between order statistics of `values`: the highest one that the count of
    values below the quantile (Binomial(n, q)) reaches at most 2.5% of the time, and the lowest it stays at or under
    97.5% of the time; NaN for a side no order statistic bounds."""
    from scipy.special import bdtr  # importing scipy.stats would slow every run's end

    ordered = np.sort(np.ravel(values))
    n = ordered.size
    cdf = bdtr(np.arange(n + 1), n, q)  # P(at most k of the n values fall below the quantile)
    alpha = (1 - CONFIDENCE) / 2
    below = np.flatnonzero(cdf <= alpha)
    above = int(np.flatnonzero(cdf >= 1 - alpha)[0])
    lower = float(ordered[below[-1]]) if below.size else math.nan
    return lower, float(ordered[above]) if above < n else math.nan


def tokens_needed(q: float) -> int:
    """The fewest values for which an order statistic bounds the q-quantile from above at 95%: q^n <= 2.5%."""
    return math.ceil(math.log((1 - CONFIDENCE) / 2) / math.log(q))


def percentile_figures(decode: np.ndarray) -> tuple[dict[str, float], list[str]]:
    """Per-token p50, p90 and p99 of the decode steps' times with their intervals (tpot_p99_lo_s, tpot_p99_hi_s), and a
    note for each percentile the tokens are too few to bound from above."""
    values = np.ravel(decode)
    values = values[np.isfinite(values)]
    if not values.size:
        return {f"tpot_{name}_s": math.nan for name, _ in PERCENTILES}, []
    metrics: dict[str, float] = {}
    notes: list[str] = []
    for name, q in PERCENTILES:
        value = float(np.percentile(values, 100 * q))
        lower, upper = percentile_interval(values, q)
        metrics[f"tpot_{name}_s"] = value
        if not math.isnan(lower):
            metrics[f"tpot_{name}_lo_s"] = lower
        if not math.isnan(upper):
            metrics[f"tpot_{name}_hi_s"] = upper
            continue
        bound = "unbounded below and above" if math.isnan(lower) else f"from {_seconds(lower)}, unbounded above"
        notes.append(
            f"per token {name} {_seconds(value)} rests on {values.size} tokens, too few to be more than their maximum: "
            f"its 95% interval runs {bound}; a bounded one needs {tokens_needed(q)} tokens (more task.new_tokens or "
            "samples)"
        )
    return metrics, notes


def _seconds(value: float) -> str:
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("µs", 1e-6)):
        if abs(value) >= scale:
            return f"{value / scale:.3g} {unit}"
    return f"{value / 1e-9:.3g} ns"

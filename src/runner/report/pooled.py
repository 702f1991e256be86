"""A sweep's answer: its replicates pooled, each configuration against the fastest doing the same work, said in
one sentence and a short table.

Runs that differ only in `seed` (REPLICATE_KEYS) are replicates of one configuration: the same work with other
weights and inputs, each in its own process. They are pooled round by round (the rounds launcher measures every
job in each round): a configuration's time in a round is the geometric mean of its replicates' typical times in
it (runner.measure.samples.turn_typical; each replicate's stalled turns pulled in first), its typical time the
geometric mean of its replicates' typical times, and its ratio to the fastest configuration runner.report.ratio's
over those pooled rounds. Each process keeps an offset of its own that
rounds cannot see: the interval holds the spread between processes that the replicates show
(ratio.process_spread), shrunk by the square root of the replicates each configuration averages.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace
from itertools import pairwise
from pathlib import Path
from typing import Any, cast

import numpy as np
import pandas as pd

from runner.measure.machine_load import BUSY_OTHER_RUNNABLE
from runner.measure.samples import turn_typical, typical_s
from runner.record.result import Status
from runner.record.table import format_seconds
from runner.report.frames import _param_cell, _records, compare, setup_notes, short_name, varied_params, work_keys
from runner.report.ratio import (
    ASSUMED,
    UNSTABLE_DISAGREE,
    UNSTABLE_SPREAD,
    ProcessSpread,
    Verdict,
    instability,
    process_count,
    process_spread,
    tamed,
    time_ratio,
)

REPLICATE_KEYS = ("params.seed",)  # runs that differ only in these measure one configuration
WIDE = 1.5  # an interval whose high / low exceeds this gives the size of a difference only roughly
BARE = ("params.dtype",)  # keys shown as their value alone, as group choices (`backend.name`) are


@dataclass(frozen=True)
class Pooled:
    """One configuration of a sweep, its replicates pooled, against the fastest doing the same work."""

    workload: str  # the work it did, where the sweep did more than one ("" otherwise)
    label: str  # what varied, seed aside: "torch", "torch · function"
    key: str  # the label as an MLflow metric name's prefix: "torch", "torch_function"
    runs: int  # replicates pooled
    time_s: float  # typical time per call: the geometric mean of its replicates' typical times
    ratio: float  # time / the fastest's; 1 for the fastest
    low: float  # 95% interval (NaN where there is none)
    high: float
    verdict: Verdict
    reason: str | None = None
    busy: float = 0.0  # other runnable threads while timed, on average over its replicates
    is_fastest: bool = False  # the one of the lowest typical time, which the others are compared with


def pool(frame: pd.DataFrame) -> list[Pooled]:
    """The finished, timed runs of `frame` grouped into configurations (replicates pooled), per workload in
    the order they came, fastest first within each."""
    timed = frame[(frame["status"] == Status.FINISHED) & frame["metrics.time_median_s"].notna()]
    if timed.empty:
        return []
    varied = [k for k in varied_params(frame) if k not in REPLICATE_KEYS]
    work = work_keys(frame) + (["setup"] if "setup" in frame and frame["setup"].nunique() > 1 else [])
    shown = [k for k in varied if k not in work]
    out: list[Pooled] = []
    for _, group in timed.groupby([timed[k].map(str) for k in work] or [timed["status"]], sort=False):
        title = _workload(group.iloc[0], [k for k in work if k in varied or k == "setup"])
        configs = [(_label(c.iloc[0], shown), _key(c.iloc[0], varied), c) for c in _configurations(group, varied)]
        out += _compared(title, configs)
    return out


def _configurations(group: pd.DataFrame, varied: list[str]) -> list[pd.DataFrame]:
    if not varied:
        return [group]
    return [c for _, c in group.groupby([group[k].map(str) for k in varied], sort=False)]


def _compared(title: str, configs: list[tuple[str, str, pd.DataFrame]]) -> list[Pooled]:
    rounds = {key: _pooled_rounds(runs) for _, key, runs in configs}
    times = {key: _typical(runs, rounds[key]) for _, key, runs in configs}
    fastest_key = min(times, key=lambda k: times[k])
    spread = _process_spread(configs)
    unstable = {key: _instability(runs, _pooled_rounds(runs, tame=False)) for _, key, runs in configs}
    out = []
    for label, key, runs in configs:
        busy = float(runs.get("metrics.machine_other_runnable", pd.Series(dtype=float)).mean() or 0.0)
        common: dict[str, Any] = dict(
            workload=title, label=label, key=key, runs=len(runs), time_s=times[key], busy=busy
        )
        common["is_fastest"] = key == fastest_key
        by_times = times[key] / times[fastest_key]
        if key == fastest_key:
            verdict = (Verdict.UNSTABLE, unstable[key]) if unstable[key] else (Verdict.FASTEST, None)
            found = (1.0, math.nan, math.nan, *verdict)
        elif unstable[key]:
            found = (by_times, math.nan, math.nan, Verdict.UNSTABLE, unstable[key])
        elif unstable[fastest_key]:
            found = (by_times, math.nan, math.nan, Verdict.CANNOT_TELL, "the fastest is unstable")
        else:
            processes = (_processes(runs), _processes(next(r for _, k, r in configs if k == fastest_key)))
            found = _versus(rounds[key], rounds[fastest_key], by_times, spread, processes, len(configs) - 1)
        compared: dict[str, Any] = dict(zip(("ratio", "low", "high", "verdict", "reason"), found, strict=True))
        out.append(Pooled(**common, **compared))
    return sorted(out, key=lambda p: (not p.is_fastest, p.ratio))


def _pooled_rounds(runs: pd.DataFrame, tame: bool = True) -> tuple[np.ndarray, np.ndarray] | None:
    """A configuration's typical time per round (samples.turn_typical) over its replicates, as their geometric
    mean, with the round numbers; None where a replicate has no samples here."""
    samples = list(runs["samples_s"]) if "samples_s" in runs else [None]
    if any(s is None for s in samples):
        return None
    turns = [turn_typical(cast(np.ndarray, s), r) for s, r in zip(samples, _rounds_of(runs), strict=True)]  # no None
    # each replicate's stalled turns pulled in first (ratio.tamed): replicates that stall in different rounds would
    # otherwise lift most rounds' mean, and the median over rounds with them
    pull = tamed if tame else (lambda logs: logs)
    logs_of = [dict(zip(sorted(t), pull(np.log([t[n] for n in sorted(t)])), strict=True)) for t in turns]
    numbers = sorted(set().union(*turns))
    logs = [np.mean([t[n] for t in logs_of if n in t]) for n in numbers]
    return np.exp(logs), np.array(numbers)


def _typical(runs: pd.DataFrame, rounds: tuple[np.ndarray, np.ndarray] | None) -> float:
    """The configuration's typical time: the geometric mean of its replicates' typical times, the figures the job
    table shows beside it (the median of their medians where samples are missing)."""
    if rounds is None:
        return float(runs["metrics.time_median_s"].median())
    each = [typical_s(s, r) for s, r in zip(runs["samples_s"], _rounds_of(runs), strict=True)]
    return float(np.exp(np.mean(np.log(each))))


def _instability(runs: pd.DataFrame, rounds: tuple[np.ndarray, np.ndarray] | None) -> str | None:
    """Why a configuration gets no verdict: its replicates' typical times (medians where samples are missing)
    spread more than UNSTABLE_SPREAD, or its pooled rounds do (ratio.instability)."""
    times = runs["metrics.time_median_s"].to_numpy(dtype=float)
    if rounds is not None:
        times = np.array([typical_s(s, r) for s, r in zip(runs["samples_s"], _rounds_of(runs), strict=True)])
    if len(times) > 1 and times.max() / times.min() > UNSTABLE_SPREAD:
        return f"its replicates' typical times spread {times.max() / times.min():.0f}x"
    return None if rounds is None else instability(*rounds)


def _processes(runs: pd.DataFrame) -> int:
    """The worker processes a configuration's replicates were measured in, all of them together."""
    processes = runs["sample_processes"] if "sample_processes" in runs else [None] * len(runs)
    return sum(process_count((s, None, p)) for s, p in zip(runs.get("samples_s", processes), processes, strict=True))


def _rounds_of(runs: pd.DataFrame) -> list:
    return list(runs["sample_rounds"]) if "sample_rounds" in runs else [None] * len(runs)


def _process_spread(configs: list[tuple[str, str, pd.DataFrame]]) -> ProcessSpread:
    """The spread between worker processes that the replicates show (ratio.process_spread), PROCESS_SD without."""
    jobs, names = [], []
    for _, key, runs in configs:
        for _, run in runs.iterrows():
            if run.get("samples_s") is not None:
                jobs.append((run["samples_s"], run.get("sample_rounds"), run.get("sample_processes")))
                names.append(key)
    return process_spread(jobs, names) if jobs else ASSUMED


def _versus(
    runs: tuple[np.ndarray, np.ndarray] | None,
    fastest: tuple[np.ndarray, np.ndarray] | None,
    by_times: float,
    spread: ProcessSpread,
    processes: tuple[int, int],
    comparisons: int,
) -> tuple:
    """A configuration's ratio to the fastest over their pooled rounds; each averages the offsets of its
    `processes` (all its replicates' together)."""
    if runs is None or fastest is None:
        return by_times, math.nan, math.nan, Verdict.CANNOT_TELL, "no samples"
    sd, df = spread.sd, spread.df
    ratio = time_ratio(*runs, *fastest, comparisons=comparisons, process_sd=sd, process_df=df, processes=processes)
    if max(ratio.value / by_times, by_times / ratio.value) > UNSTABLE_DISAGREE:
        reason = f"{ratio.value:.2f}x over its rounds, {by_times:.2f}x by the typical times"
        return by_times, math.nan, math.nan, Verdict.UNSTABLE, reason  # the ratio that agrees with the times beside it
    # the rounds give the interval's width, the typical times beside it its centre: replicates that stall in
    # different rounds move the pooled rounds' median, not the replicates' own typical times
    shift = by_times / ratio.value
    centred = replace(ratio, value=by_times, low=ratio.low * shift, high=ratio.high * shift)
    return centred.value, centred.low, centred.high, *centred.verdict()


def _workload(row: pd.Series, keys: list[str]) -> str:
    return " · ".join(_setting(k, row[k]) for k in keys)


def _label(row: pd.Series, keys: list[str]) -> str:
    return " · ".join(_setting(k, row[k]) for k in keys) or "all runs"


def _setting(key: str, value: object) -> str:
    """'torch' for a group's choice or a dtype, 'threads=2' for a plain key, 'setup 2' for a setup."""
    if key == "setup":
        return f"setup {value}"
    if key.endswith(".name") or key in BARE:
        return _param_cell(value)
    return f"{short_name(key).rsplit('.', 1)[-1]}={_param_cell(value)}"


def _key(row: pd.Series, keys: list[str]) -> str:
    """A configuration as an MLflow metric name's prefix (letters, digits, _ . -): 'torch_function', 'numpy_n64'."""
    parts = [_setting(k, row[k]).replace("=", "") for k in keys] or ["all"]
    return re.sub(r"[^\w.\-]", "-", "_".join(parts))


# -- saying it -----------------------------------------------------------------------------------


def times(value: float) -> str:
    """A time ratio as the answer says it: '1.31x', '29x', '253x'."""
    return f"{value:.0f}x" if value >= 9.95 else f"{value:.2f}x"


def interval_text(p: Pooled) -> str:
    """'[25–34]', or '' where there is no interval."""
    return f"[{_interval(p)[:-1]}]" if _interval(p) else ""


def _interval(p: Pooled) -> str:
    if math.isnan(p.low):
        return ""
    if p.high >= 9.95:
        return f"{p.low:.0f}–{p.high:.0f}x"
    return f"{p.low:.2f}–{p.high:.2f}x"


def sentence(pooled: list[Pooled]) -> str:
    """The answer in one sentence per workload: 'numpy fastest; torch 29x [25–34]; jax 250x [200–310]; the
    order is certain, the sizes uncertain: busy machine (1.2 other runnable threads)'."""
    parts = []
    for title, group in _by_workload(pooled):
        if len(group) == 1:
            one = group[0]
            parts.append(f"{title + ': ' if title else ''}{one.label} {format_seconds(one.time_s)} a call")
            continue
        steps = [f"{group[0].label} fastest ({format_seconds(group[0].time_s)})"]
        steps += [f"{p.label} {times(p.ratio)} {interval_text(p) or _no_interval(p)}".rstrip() for p in group[1:]]
        parts.append(f"{title + ': ' if title else ''}{'; '.join(steps)}; {_certainty(group)}")
    return ". ".join(parts)


def _no_interval(p: Pooled) -> str:
    return f"({p.verdict})" if p.verdict in (Verdict.UNSTABLE, Verdict.CANNOT_TELL) else ""


def _by_workload(pooled: list[Pooled]) -> list[tuple[str, list[Pooled]]]:
    titles = list(dict.fromkeys(p.workload for p in pooled))
    return [(t, [p for p in pooled if p.workload == t]) for t in titles]


def _certainty(group: list[Pooled]) -> str:
    """How far to trust the order and the sizes: the intervals, the verdicts and how busy the machine was."""
    others = group[1:]
    unstable = [p.label for p in group if p.verdict == Verdict.UNSTABLE]
    if unstable:
        order = f"the order is uncertain ({', '.join(unstable)}: measurements that disagree)"
    elif any(p.verdict == Verdict.CANNOT_TELL for p in others):
        order = "the order is uncertain (" + "; ".join(f"{p.label}: {p.reason}" for p in others if p.reason) + ")"
    elif any(p.verdict == Verdict.WITHIN_NOISE for p in others):
        order = "within noise: " + ", ".join(p.label for p in others if p.verdict == Verdict.WITHIN_NOISE)
    elif all(a.high < b.low for a, b in pairwise(others)):
        order = "the order is certain"
    else:
        order = "faster than the rest is certain, the order after it is not"
    busy = max(p.busy for p in group)
    if busy > BUSY_OTHER_RUNNABLE:
        return f"{order}, the sizes uncertain: busy machine ({busy:.1f} other runnable threads)"
    bounded = [p for p in others if not math.isnan(p.low)]
    if any(p.high / p.low > WIDE for p in bounded):
        return f"{order}, the sizes only roughly (wide intervals)"
    if bounded:
        error = max(max(p.high / p.ratio, p.ratio / p.low) for p in bounded) - 1
        return f"{order}, the sizes to ±{100 * error:.0f}%"
    return order


TABLE_HEADERS = ["configuration", "runs", "time / call", "time / fastest", "95% interval", "verdict"]


def table_cells(pooled: list[Pooled]) -> tuple[list[str], list[list[str]]]:
    """The short table under the sentence (at most 8 columns): a row per configuration, the workload first where
    the sweep did more than one."""
    several = len({p.workload for p in pooled}) > 1
    headers = (["workload"] if several else []) + TABLE_HEADERS
    nbsp = "\u00a0"  # keeps '58.5 µs' and '25–34x' whole in a narrow column
    cells = [
        ([p.workload] if several else [])
        + [p.label, str(p.runs), format_seconds(p.time_s).replace(" ", nbsp), times(p.ratio), _interval(p)]
        + [_verdict(p)]
        for p in pooled
    ]
    return headers, cells


def _verdict(p: Pooled) -> str:
    words = {
        Verdict.FASTEST: "fastest",
        Verdict.WITHIN_NOISE: "within noise",
        Verdict.DIFFERENT: "slower",
        Verdict.CANNOT_TELL: "cannot tell",
        Verdict.UNSTABLE: "unstable",
    }
    return words[p.verdict] + (f" ({p.reason})" if p.reason and p.verdict == Verdict.CANNOT_TELL else "")


def metrics(pooled: list[Pooled]) -> dict[str, float]:
    """The pooled figures as a parent run's metrics: per configuration its typical time (µs, as the jobs' metrics),
    time / fastest and its interval, and how many replicates; NaN ones left out."""
    out: dict[str, float] = {}
    for p in pooled:
        values = {
            "time_typical_us": p.time_s * 1e6,
            "time_ratio": p.ratio,
            "time_ratio_ci_low": p.low,
            "time_ratio_ci_high": p.high,
            "n_replicates": float(p.runs),
        }
        out |= {f"{p.key}.{name}": float(f"{v:.4g}") for name, v in values.items() if not math.isnan(v)}
    return out


def tags(pooled: list[Pooled]) -> dict[str, str]:
    """The verdict as a parent run's tags: `verdict` (the sentence) and `fastest` (per workload)."""
    if not pooled:
        return {}
    fastest = [(f"{t}: " if t else "") + g[0].label for t, g in _by_workload(pooled)]
    return {"verdict": sentence(pooled)[:5000], "fastest": "; ".join(fastest)[:5000]}


# -- the sweep's summary -------------------------------------------------------------------------


NOTE_COLUMNS = ("time_median_s", "time_iqr_s", "time_typical_s", "time_ratio", "time_ratio_ci", "within_noise")


@dataclass(frozen=True)
class Answer:
    """What a sweep says first (its parent run's description, summary.md, the terminal's last lines)."""

    pooled: list[Pooled]
    markdown: str  # the sentence, then a row per configuration
    details: str  # a row per job (at most 7 columns), then where the runs came from several setups

    def metrics(self) -> dict[str, float]:
        return metrics(self.pooled)

    def tags(self) -> dict[str, str]:
        return tags(self.pooled)


def answer(frame: pd.DataFrame) -> Answer:
    """The sweep's answer and its details, from its runs (runner.report.frames)."""
    from runner.record.table import markdown

    found = pool(frame)
    text = f"**{sentence(found)}**\n\n{markdown(*table_cells(found))}" if found else ""
    return Answer(found, text, markdown(*job_table(frame)) + "".join(f"\n{n}\n" for n in setup_notes(frame)))


def job_table(frame: pd.DataFrame) -> tuple[list[str], list[list[str]]]:
    """A row per job (at most 8 columns), named by what varied (seed included) and its number ('torch · seed=1
    #3'): status, median, IQR, typical time, time / fastest job, interval and verdict; narrow enough for MLflow's
    description."""
    from runner.record.table import COLUMNS, present, rows

    compared = compare(frame)
    records = _records(compared)
    shown = present(tuple(c for c in COLUMNS if c.key in NOTE_COLUMNS), records)
    varied = varied_params(compared)
    names = [
        " · ".join(_setting(k, row[k]) for k in varied if _param_cell(row[k])) + f" #{Path(str(row['run_dir'])).name}"
        for _, row in compared.iterrows()
    ]
    status = compared["status"].map(str).tolist()
    cells = [[name, s, *cells] for name, s, cells in zip(names, status, rows(shown, records), strict=True)]
    return ["job", "status", *(c.label for c in shown)], cells

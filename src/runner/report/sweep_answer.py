"""A sweep's answer in words: the sentence, the configurations' table and the jobs' table, and the parent run's
metrics and tags, from the configurations runner.report.pooled pooled.

The sentence opens with the fastest configuration and each other's time / the fastest with its interval, or with "no
reliable order" where no order is certain (a configuration's rounds disagree, or a comparison cannot tell), saying why.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path

import pandas as pd

from runner.measure.machine_load import was_busy
from runner.record.table import format_interval, format_ratio, format_seconds, ratio_figure
from runner.report.comparison import Verdict
from runner.report.frames import (
    column_labels,
    compare,
    host_column,
    param_cell,
    setup_notes,
    table_records,
    varied_params,
)
from runner.report.pooled import Pooled, pool, setting_text
from runner.tasks import Task, builtin_metrics

WIDE = 1.5  # an interval whose high / low exceeds this gives the size of a difference only roughly

# -- saying it -----------------------------------------------------------------------------------


def _time_said(p: Pooled) -> str:
    """'607 µs' a call, for a training step '363 µs a step', for a generation '607 µs a generation, 139 µs a token'."""
    said = format_seconds(p.time_s) if p.unit == Task.unit else f"{format_seconds(p.time_s)} {p.unit}"
    return f"{said}, {format_seconds(p.part_s)} {p.part}" if p.part else said


def _ratio_said(p: Pooled) -> str:
    """'2.3x', or '1.3x a token' where too few whole calls fit for an interval and their parts were compared."""
    return f"{format_ratio(p.ratio)} {p.part}" if p.comparison.of_parts and p.part else format_ratio(p.ratio)


def interval_text(p: Pooled) -> str:
    """'[25–34]', or '' where there is no interval."""
    return f"[{_interval(p)[:-1]}]" if _interval(p) else ""


def _interval(p: Pooled) -> str:
    return format_interval((p.low, p.high))


def sentence(pooled: list[Pooled]) -> str:
    """The answer in one sentence per workload: 'numpy fastest; torch 29x [25–34]; jax 250x [200–310]; the
    order is certain, the sizes known to ±12%', opening on what was timed
    where that is not the default ('train_step (adam) on mlp: torch fastest (363 µs a step); ...')."""
    parts = []
    for i, (workload, group) in enumerate(_by_workload(pooled)):
        title = " · ".join(t for t in (group[0].timed if i == 0 else "", workload) if t)
        if len(group) == 1:
            one = group[0]
            parts.append(f"{title + ': ' if title else ''}{one.label} {format_seconds(one.time_s)} {one.unit}")
            continue
        ranked = [p for p in group if p.comparison.ranked]  # too few samples: listed after the order, not in it
        unranked = [f"{p.label} {_time_said(p)}, {p.reason}" for p in group if not p.comparison.ranked]
        if len(ranked) < 2 or _order_unknown(ranked):
            parts.append(f"{title + ': ' if title else ''}{_no_reliable_order(group)}")
            continue
        steps = [f"{ranked[0].label} fastest ({_time_said(ranked[0])})"]
        steps += [f"{p.label} {_ratio_said(p)} {interval_text(p) or _no_interval(p)}".rstrip() for p in ranked[1:]]
        parts.append(f"{title + ': ' if title else ''}{'; '.join(steps + unranked)}; {_certainty(ranked)}")
        parts += versions_said(group)
    return ". ".join(parts)


def versions_said(group: list[Pooled]) -> list[str]:
    """Where configurations ran in Python environments whose versions differ (environment.*), each against the
    fastest in words, the older release first: 'torch 2.13.0 → 2.14.1: 1.04x [1.02–1.06] slower' ('faster' where
    the newer is the fastest; 'within noise' where the interval holds 1)."""
    fastest = group[0]
    said = []
    for p in group[1:]:
        changed = _changed(fastest.versions, p.versions)
        if not changed or p.verdict in (Verdict.UNSTABLE, Verdict.CANNOT_TELL):
            continue
        newer = _is_newer(*changed[0][1:])  # the compared one's release is the newer: going up made it slower
        steps = ", ".join(f"{name} {a} → {b}" if newer else f"{name} {b} → {a}" for name, a, b in changed)
        word = "within noise" if p.verdict == Verdict.WITHIN_NOISE else "slower" if newer else "faster"
        said.append(f"{steps}: {_ratio_said(p)} {interval_text(p)} {word}".replace("  ", " "))
    return said


def _changed(before: str, after: str) -> list[tuple[str, str, str]]:
    """(package, its version in `before`, in `after`) for each package in both whose version differs (where none
    does: each added or removed, '—' on the side that lacks it); two resolved sets as 'name==version ...'
    (Pooled.versions); none where either is unknown (the runner's own environment)."""
    if not before or not after:
        return []
    was, now = (dict(item.split("==", 1) for item in text.split() if "==" in item) for text in (before, after))
    changed = [(name, was.get(name, "—"), now.get(name, "—")) for name in sorted(was.keys() | now.keys())
               if was.get(name) != now.get(name)]  # fmt: skip
    moved = [change for change in changed if "—" not in change]  # a release's own dependencies come and go with it
    return moved or changed


def _is_newer(before: str, after: str) -> bool:
    """Whether release `after` comes after `before` (as text where either is no version: a commit)."""
    from packaging.version import InvalidVersion, Version

    try:
        return Version(after) > Version(before)
    except InvalidVersion:
        return after > before


def _order_unknown(group: list[Pooled]) -> bool:
    """No order is certain: a configuration's rounds or replicates disagree (unstable), or a comparison has no
    verdict (cannot tell: one round, a busy machine, an unstable baseline)."""
    return any(p.verdict in (Verdict.UNSTABLE, Verdict.CANNOT_TELL) for p in group)


UNSTABLE_ADVICE = "quiet the machine, or pin each job: threads=1"


def _no_reliable_order(group: list[Pooled]) -> str:
    """'no reliable order (torch: its rounds disagree: rounds 1-10 at 536 µs, 11-33 at 106 ms; quiet the machine, or
    pin each job: threads=1): jax 7.05 ms a step; torch 17.6 ms a step, unstable'. No winner opens it, and an unstable
    configuration gets its typical time and no ratio, which its disagreeing rounds do not support."""
    unstable = [p for p in group if p.verdict == Verdict.UNSTABLE]
    why = [f"{p.label}'s measurements disagree: {p.reason}" for p in unstable]
    if unstable:
        why.append(UNSTABLE_ADVICE)
    why += [f"{p.label}: {p.reason}" for p in group if p.verdict == Verdict.CANNOT_TELL and p.reason and not unstable]
    said = []
    for p in group:
        if not p.comparison.ranked:
            said.append(f"{p.label} {_time_said(p)}, {p.reason}")
        elif p.verdict == Verdict.UNSTABLE or p is group[0]:
            said.append(f"{p.label} {_time_said(p)}{', unstable' if p.verdict == Verdict.UNSTABLE else ''}")
        else:
            said.append(f"{p.label} {_ratio_said(p)} {interval_text(p) or _no_interval(p)}".rstrip())
    # under two with samples enough (MIN_RANK_SAMPLES): what is missing is time, not a quieter machine
    opening = "no reliable order" if sum(p.comparison.ranked for p in group) > 1 else "not enough samples for an order"
    return f"{opening} ({'; '.join(dict.fromkeys(why))}): {'; '.join(said)}"


def _no_interval(p: Pooled) -> str:
    return f"({p.verdict})" if p.verdict in (Verdict.UNSTABLE, Verdict.CANNOT_TELL) else ""


def _by_workload(pooled: list[Pooled]) -> list[tuple[str, list[Pooled]]]:
    titles = list(dict.fromkeys(p.workload for p in pooled))
    return [(t, [p for p in pooled if p.workload == t]) for t in titles]


def _certainty(group: list[Pooled]) -> str:
    """How far to trust the order and the sizes, in the intervals' own terms (how a busy machine moved the rounds is
    in them); how busy the machine was only where there is no interval."""
    others = group[1:]  # none unstable or without a verdict: those say `no reliable order` instead
    if any(p.verdict == Verdict.WITHIN_NOISE for p in others):
        order = "within noise: " + ", ".join(p.label for p in others if p.verdict == Verdict.WITHIN_NOISE)
    elif all(a.high < b.low for a, b in pairwise(others)):
        order = "the order is certain"
    else:
        order = "faster than the rest is certain, the order after it is not"
    bounded = [p for p in others if not math.isnan(p.low)]
    if bounded:  # in the intervals' own terms: a busy machine is in them already (its rounds widen them)
        return f"{order}, {sizes_known(bounded)}"
    busy = max(p.busy for p in group)
    if was_busy(busy):  # no interval to hold it: measured apart, or unstable
        return f"{order}, the sizes uncertain: no interval, and a busy machine ({busy:.1f} other runnable threads)"
    return order


def sizes_known(bounded: list[Pooled]) -> str:
    """How well the intervals give the sizes: 'the sizes known to ±12%' (the widest interval's farther end from its
    ratio), 'the sizes known only to ±40%' where an interval spans more than WIDE, 'the sizes known only
    within a factor of 29' beyond ±100%."""
    far = max(max(p.high / p.ratio, p.ratio / p.low) for p in bounded)
    wide = any(p.high / p.low > WIDE for p in bounded)
    if far >= 2:
        return f"the sizes known only within a factor of {far:.2g}"
    return f"the sizes known {'only ' if wide else ''}to ±{100 * (far - 1):.0f}%"


def table_cells(pooled: list[Pooled]) -> tuple[list[str], list[list[str]]]:
    """The short table under the sentence: a row per configuration, the workload first where the sweep did more than
    one, the time per call in the task's unit ('time / generation'), then its task's own columns (first token, per
    token, tokens/s)."""
    several = len({p.workload for p in pooled}) > 1
    own = list(dict.fromkeys(heading for p in pooled for heading, _ in p.figures))
    headers = (["workload"] if several else []) + ["configuration", "runs", f"time / {_unit_word(pooled)}"]
    nodes = any(p.nodes > 1 for p in pooled)  # what the interval rests on: '20 rounds on 3 nodes'
    headers += ["time / fastest configuration", "95% interval", *(["ratio from"] if nodes else []), "verdict", *own]
    nbsp = "\u00a0"  # keeps '58.5 µs' and '25–34x' whole in a narrow column
    cells = [
        ([p.workload] if several else [])
        + [
            p.label,
            _runs(p),
            format_seconds(p.time_s).replace(" ", nbsp),
            _ratio_said(p).replace(" ", nbsp),
            _interval(p),
        ]
        + ([p.comparison.basis or ""] if nodes else [])
        + [_verdict(p)]
        + [dict(p.figures).get(heading, "").replace(" ", nbsp) for heading in own]
        for p in pooled
    ]
    return headers, cells


def _unit_word(pooled: list[Pooled]) -> str:
    """The configurations' unit without its article ('generation'), 'call' where they differ."""
    units = {p.unit for p in pooled}
    return units.pop().split(" ", 1)[-1] if len(units) == 1 else Task.unit.split(" ", 1)[-1]


def calls_said(pooled: list[Pooled]) -> str:
    """'one call: a generation of 16 prompt + 8 new tokens, batch 32', where the task says what a call is."""
    calls = list(dict.fromkeys(p.call for p in pooled if p.call))
    return f"one call: {'; '.join(calls)}" if calls else ""


def _runs(p: Pooled) -> str:
    """Its replicates, and the nodes they ran on where more than one: '3 on 3 nodes'."""
    return f"{p.runs} on {p.nodes} nodes" if p.nodes > 1 else str(p.runs)


def _verdict(p: Pooled) -> str:
    """The verdict as the comparison words it; an unstable one's reason is long (the job table has it)."""
    return str(p.verdict) if p.verdict == Verdict.UNSTABLE else p.comparison.words()


def metrics(pooled: list[Pooled]) -> dict[str, float]:
    """The pooled figures as a parent run's metrics: per configuration its typical time (µs, as the jobs' metrics),
    a part's where the task times parts (`part_typical_us`: a token's, what a ratio 'a token' compares and the
    sentence says), time / fastest and its interval, and how many replicates; NaN ones left out."""
    out: dict[str, float] = {}
    for p in pooled:
        values = {
            "time_typical_us": float(f"{p.time_s * 1e6:.3g}"),  # as format_seconds prints it
            "part_typical_us": float(f"{p.part_s * 1e6:.3g}"),
            "time_ratio": ratio_figure(p.ratio),  # as the tables print them
            "time_ratio_ci_low": ratio_figure(p.low),
            "time_ratio_ci_high": ratio_figure(p.high),
            "n_replicates": float(p.runs),
        }
        out |= {f"{p.key}.{name}": v for name, v in values.items() if not math.isnan(v)}
    return out | ranked_metrics(pooled)


def ranked_metrics(pooled: list[Pooled]) -> dict[str, float]:
    """The answer under names every sweep shares, so that the runs list shows one column across sweeps whatever
    they compared: `fastest.time_typical_us`, `next_fastest.time_ratio` with its interval (the fastest's margin),
    `slowest.time_ratio`; for a sweep of one workload (of several, the configurations' own names say which)."""
    if not pooled or len({p.workload for p in pooled}) > 1:
        return {}
    out = {"fastest.time_typical_us": float(f"{pooled[0].time_s * 1e6:.3g}")}
    if len(pooled) > 1:
        following = pooled[1]
        out |= {
            "next_fastest.time_ratio": ratio_figure(following.ratio),
            "next_fastest.time_ratio_ci_low": ratio_figure(following.low),
            "next_fastest.time_ratio_ci_high": ratio_figure(following.high),
            "slowest.time_ratio": ratio_figure(max(p.ratio for p in pooled)),
        }
    return {k: v for k, v in out.items() if not math.isnan(v)}


def tags(pooled: list[Pooled]) -> dict[str, str]:
    """The verdict as a parent run's tags: `verdict` (the sentence) and `fastest` (per workload)."""
    if not pooled:
        return {}
    fastest = [(f"{t}: " if t else "") + g[0].label for t, g in _by_workload(pooled)]
    return {"verdict": sentence(pooled)[:5000], "fastest": "; ".join(fastest)[:5000]}


# -- the sweep's summary -------------------------------------------------------------------------


NOTE_COLUMNS = (
    *("time_median_s", "time_iqr_s", "time_typical_s", "time_ratio", "time_ratio_ci", "within_noise"),
    *(m.key for m in builtin_metrics() if m.in_terminal),  # a task's own columns: first token, per token, tokens/s
)


@dataclass(frozen=True)
class Answer:
    """What a sweep says first (its parent run's description, summary.md, the terminal's last lines)."""

    pooled: list[Pooled]
    headline: str  # the sentence, in bold
    call: str  # what one call is, where the task says it (calls_said)
    table: str  # a row per configuration
    details: str  # a row per job, then where the runs came from several setups

    @property
    def markdown(self) -> str:
        """The sentence, what one call is, then a row per configuration."""
        return "\n\n".join(part for part in (self.headline, self.call, self.table) if part)

    def metrics(self) -> dict[str, float]:
        return metrics(self.pooled)

    def tags(self) -> dict[str, str]:
        return tags(self.pooled)


def answer(frame: pd.DataFrame) -> Answer:
    """The sweep's answer and its details, from its runs (runner.report.frames)."""
    from runner.record.table import markdown

    found = pool(frame)
    details = markdown(*job_table(frame)) + "".join(f"\n{n}\n" for n in setup_notes(frame))
    if not found:
        return Answer(found, "", "", "", details)
    return Answer(found, f"**{sentence(found)}**", calls_said(found), markdown(*table_cells(found)), details)


def job_table(frame: pd.DataFrame) -> tuple[list[str], list[list[str]]]:
    """A row per job (at most 8 columns, and the host where the runs ran on several: frames.host_column), named by what
    varied (seed included) and its number ('torch · seed=1 #3'): status, median, IQR, typical time, time / fastest
    job, interval and verdict; narrow enough for MLflow's description."""
    from runner.record.table import COLUMNS, present, rows

    compared = compare(frame)
    records = table_records(compared)
    shown = present(tuple(c for c in COLUMNS if c.key in NOTE_COLUMNS), records)
    varied = varied_params(compared)
    names = [
        " · ".join(setting_text(k, row[k]) for k in varied if param_cell(row[k]))
        + f" #{Path(str(row['run_dir'])).name}"
        for _, row in compared.iterrows()
    ]
    where = host_column(compared)  # the host, as in the terminal's table and runs.md
    status = [[str(row["status"]), *(param_cell(row[k]) for k in where)] for _, row in compared.iterrows()]
    cells = [[name, *s, *cells] for name, s, cells in zip(names, status, rows(shown, records), strict=True)]
    return ["job", "status", *where, *column_labels(shown, compared)], cells

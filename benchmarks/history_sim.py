#!/usr/bin/env python
"""Finding steps in a case's history, on simulated series whose truth is known: the chosen detector
(runner.history.steps: a weighted L1 fit, asv's approach) against two independent ones on the same series: Apache
Otava's (Hunter's e-divisive split and merge, each change point tested at p <= 0.001: otava.analysis) and PELT's
optimum (a squared-error fit, ruptures' "l2" cost, with the Schwarz penalty).

    .venv/bin/pip install --no-deps apache-otava==0.8.0        # once; benchmark-only, never imported by src/
    .venv/bin/python benchmarks/history_sim.py                 # 1,000 series a scenario, about 10 minutes on 2 cores
    .venv/bin/python benchmarks/history_sim.py --write         # and rewrite its section of BENCHMARKS.md
    .venv/bin/python benchmarks/history_sim.py --trials 50     # a quick look
    .venv/bin/python benchmarks/history_sim.py --stores 50     # many cases at once, without and with a false-discovery
                                                               # rate (about 3 minutes); --write rewrites its section
    .venv/bin/python benchmarks/history_sim.py --nights 40     # the nightly gate on simulated nights (2 minutes)

Each series is 30-60 runs (uniform), each run's log time the case's level plus noise drawn like this tool's runs
made apart: the machine's drift between runs (ratio.APART_SD, 3%), the run's worker process's own offset
(ratio.PROCESS_SD, 1.2%) and the run's own spread, which its interval reports (sd 0.5-2%, log-uniform: the
half-widths of single sweeps' A/A intervals in BENCHMARKS.md, +-1.8-5% on a ratio of two jobs). The interval each
point carries holds only its own spread, as a run knows nothing of the drift between runs. *heavy* noise adds,
to 1 run in 12, a further move of 10-30% either way: BENCHMARKS.md's A/A apart, where one of six pairs of
TensorFlow sweeps moved 29% together (and torch 18% in an earlier run).

Scenarios: no step; a step of 3, 5, 10 or 20% (slower or faster, at random) at least 5 runs from either end; a 5%
step with exactly 10 runs after it (the series cut 10 runs after the step, so 20-50 runs before it: issue 64's "found
within 10 points after the step"), and with 20 runs after it (10-40 before); a 10% step with 2 runs after it, and
with only the newest run after it; a slow drift of 5% or 10% over the series; no step, but the machine's drift
between runs correlated from one run to the next (AR(1), 0.3 at lag 1: slow phases of the machine that outlast a
run, which steps.py estimates and allows for).
Store-shaped series (issue 81, the *sweeps* rows): SWEEPS sweeps of SEEDS runs measured together (the sweep's drift
and load shared, each run its process's offset and own spread), each run's interval claiming WIDE_SD (within-run
noise wider than the scatter between sweeps), a LOAD that comes and goes and a DRIFT over the series; steps.py is
given the runs with their sweep as Point.group, Otava and PELT each sweep's geometric mean (`pooled`), and positions
and rates count sweeps.
A step is *found* when a step the same way is reported within WINDOW runs of the truth (with 1 run after it:
suspicious); every other step reported is a false alarm, except on a drift, which has no step to find but is a
real change: what is reported there is counted the same way and read apart.

Otava is installed with --no-deps: on Python < 3.14 its package pins numpy==2.2.0 and scipy<1.17 (a plain
`pip install apache-otava` into .venv would downgrade the runtime's numpy 2.4 and scipy 1.17), and the code used
here, otava.analysis, imports only numpy and scipy. Hence no extra in pyproject.toml: an extra would pull the pins.

--stores N: N stores of QUIET series with no step and REAL with a 10% step (slower or faster, at least 5 runs from
either end), each series drawn as above, on normal noise, heavy noise, and normal noise with runs correlated 0.3.
Each store's steps are counted as each series alone reports them, and held together to a false-discovery rate of
FDR_RATE (runner.history.build.control_fdr, Benjamini-Hochberg over the steps' p-values): the false alerts (steps
in quiet series), the real steps found, the share of false ones among those kept (the false-discovery proportion,
whose mean BH bounds), and how often a quiet series' smallest p-value is at most 0.05 and 0.01.

--nights N: N stores of NIGHT_CASES cases, a run of each a night (drawn as a sweep of the store-shaped series, the
load shared by the night's cases), one case 10% slower from NIGHT_STEP's night; each night from FIRST_GATED on, the
gate as the nightly recipe runs it (runner.history.build: build, recent NEWEST, failing_steps on regressions): the
nights that fail falsely, and whether the step failed the gate within NEWEST nights of its own.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "src"), str(ROOT / "benchmarks")]
BEGIN, END = "<!-- history-sim:begin -->", "<!-- history-sim:end -->"
CHOICE = ("<!-- history-choice:begin -->", "<!-- history-choice:end -->")  # the prose after the table: kept as written
from parity import replace_section  # noqa: E402

from runner.history.build import build  # noqa: E402
from runner.history.fdr import control_fdr  # noqa: E402
from runner.history.gate import failing_steps, recent  # noqa: E402
from runner.history.series import Entry, History  # noqa: E402
from runner.history.steps import Label, Point, Step, find_steps  # noqa: E402
from runner.record.table import markdown  # noqa: E402
from runner.report.ratio import APART_SD, PROCESS_SD  # noqa: E402

WINDOW = 3  # runs either side of the true step within which a reported step counts as found
OWN_SD = (0.005, 0.02)  # a run's own sd of its log time (log-uniform)
HEAVY = (1 / 12, 0.10, 0.30)  # heavy noise: the share of runs that move further, by 10-30%
SCENARIOS = (
    ("no step", 0.0, "interior"),
    ("step 3%", 0.03, "interior"),
    ("step 5%", 0.05, "interior"),
    ("step 5%, 10 runs after", 0.05, "end10"),
    ("step 10%", 0.10, "interior"),
    ("step 20%", 0.20, "interior"),
    ("step 10%, 2 runs after", 0.10, "end2"),
    ("step 10%, 1 run after", 0.10, "end1"),
    ("drift 5%", 0.05, "drift"),
    ("drift 10%", 0.10, "drift"),
    ("no step, runs correlated 0.3", 0.0, "correlated"),
    ("step 5%, 20 runs after", 0.05, "end20"),  # last, so that the rows above keep their series (seeded by place)
)
CORRELATION = 0.3  # the "runs correlated" scenario: the drift between runs as an AR(1) series, lag-1 correlation


@dataclass(frozen=True)
class Truth:
    points: list[Point]
    at: int | None  # the first run after the step; None: no step
    ratio: float  # after / before
    sweep_of: tuple[int, ...] = ()  # each run's sweep (runs of one sweep are one point); empty: each run its own

    def point(self, index: int) -> int:
        """The point of the series (its sweep) that run `index` belongs to."""
        return self.sweep_of[index] if self.sweep_of else index

    @property
    def length(self) -> int:
        """Its points: sweeps, or runs where each is its own."""
        return self.sweep_of[-1] + 1 if self.sweep_of else len(self.points)


def simulate(rng: np.random.Generator, size: float, where: str, heavy: bool) -> Truth:
    """One series of 30-60 runs with a step of `size` (slower or faster) placed as `where` says, or a drift."""
    n = int(rng.integers(30, 61))
    sign = 1 if rng.random() < 0.5 else -1
    ratio = (1 + size) ** sign
    level = np.zeros(n)
    at: int | None = None
    if where == "drift":
        level = np.linspace(0, math.log(ratio), n)
    elif size:
        places = {"interior": int(rng.integers(5, n - 4)), "end20": n - 20, "end10": n - 10, "end2": n - 2}
        at = places.get(where, n - 1)  # the interior place is drawn for every scenario: each keeps its series
        level[at:] = math.log(ratio)
    own = np.exp(rng.uniform(math.log(OWN_SD[0]), math.log(OWN_SD[1]), n))
    apart = rng.normal(0, APART_SD, n)
    if where == "correlated":  # slow phases of the machine that outlast a run
        for i in range(1, n):
            apart[i] = CORRELATION * apart[i - 1] + math.sqrt(1 - CORRELATION**2) * apart[i]
    logs = level + apart + rng.normal(0, PROCESS_SD, n) + rng.normal(0, own)
    if heavy:
        moved = rng.random(n) < HEAVY[0]
        logs += moved * rng.choice([-1, 1], n) * np.log1p(rng.uniform(HEAVY[1], HEAVY[2], n))
    logs += math.log(1e-3)  # a 1 ms step
    points = [Point(*np.exp([y, y - 1.96 * s, y + 1.96 * s]).tolist()) for y, s in zip(logs, own, strict=True)]
    return Truth(points, at, ratio)


SWEEPS = (12, 30)  # the sweeps of a store-shaped series (uniform)
SEEDS = (2, 4)  # its runs a sweep, measured together (uniform): seeds of one configuration, processes
WIDE_SD = (0.05, 0.10)  # the sd a run's interval claims (log-uniform): its within-run noise, wider than the scatter
LOAD = (0.15, (1, 3), (0.02, 0.08))  # a load starts at a sweep with this chance, lasts 1-3 sweeps, slows them 2-8%
DRIFT = 0.03  # the machine drifts by up to this much (uniform, either way) over the series, linearly
SWEEP_SCENARIOS = (
    ("no step", 0.0, "interior"),
    ("step 5%", 0.05, "interior"),
    ("step 10%", 0.10, "interior"),
    ("step 10%, 2 sweeps after", 0.10, "end2"),
    ("step 10%, 1 sweep after", 0.10, "end1"),
    ("step 10% at the 7th of 12 sweeps, 2 seeds", 0.10, "issue81"),
)


def simulate_sweeps(rng: np.random.Generator, size: float, where: str, heavy: bool) -> Truth:
    """One store-shaped series (the module's docstring): SWEEPS sweeps of SEEDS runs each, a step of `size`
    (slower or faster) at a sweep placed as `where` says ("issue81": 12 sweeps of 2 seeds, the step at the 7th)."""
    sweeps = 12 if where == "issue81" else int(rng.integers(SWEEPS[0], SWEEPS[1] + 1))
    seeds = np.full(sweeps, 2) if where == "issue81" else rng.integers(SEEDS[0], SEEDS[1] + 1, sweeps)
    sign = 1 if rng.random() < 0.5 else -1
    ratio = (1 + size) ** sign
    places = {"interior": int(rng.integers(3, sweeps - 2)), "end2": sweeps - 2, "end1": sweeps - 1, "issue81": 6}
    at = places[where] if size else None
    shared = rng.normal(0, APART_SD, sweeps) + _load(rng, sweeps)
    shared += np.linspace(0, rng.uniform(-DRIFT, DRIFT), sweeps)
    if at is not None:
        shared[at:] += math.log(ratio)
    if heavy:
        moved = rng.random(sweeps) < HEAVY[0]
        shared += moved * rng.choice([-1, 1], sweeps) * np.log1p(rng.uniform(HEAVY[1], HEAVY[2], sweeps))
    sweep_of = np.repeat(np.arange(sweeps), seeds)
    own = np.exp(rng.uniform(math.log(OWN_SD[0]), math.log(OWN_SD[1]), len(sweep_of)))
    logs = math.log(1e-3) + shared[sweep_of] + rng.normal(0, PROCESS_SD, len(sweep_of)) + rng.normal(0, own)
    claimed = np.exp(rng.uniform(math.log(WIDE_SD[0]), math.log(WIDE_SD[1]), len(sweep_of)))
    points = [
        Point(*np.exp([y, y - 1.96 * c, y + 1.96 * c]).tolist(), group=f"sweep{k}")
        for y, c, k in zip(logs, claimed, sweep_of, strict=True)
    ]
    first = None if at is None else int(np.searchsorted(sweep_of, at))
    return Truth(points, first, ratio, tuple(int(k) for k in sweep_of))


def _load(rng: np.random.Generator, sweeps: int) -> np.ndarray:
    """The log slowdown of each sweep by a load that comes and goes (LOAD)."""
    slowed = np.zeros(sweeps)
    for start in np.flatnonzero(rng.random(sweeps) < LOAD[0]):
        length = int(rng.integers(LOAD[1][0], LOAD[1][1] + 1))
        slowed[start : start + length] = np.maximum(slowed[start : start + length], math.log1p(rng.uniform(*LOAD[2])))
    return slowed


def pooled(detect: Callable[[list[Point]], list[Step]]) -> Callable[[list[Point]], list[Step]]:
    """A detector that knows no groups, given each group's runs as one point (the geometric mean of their times), its
    steps' indices mapped back to the group's first run."""

    def pooled_detect(points: list[Point]) -> list[Step]:
        firsts = [i for i, p in enumerate(points) if not i or not p.group or p.group != points[i - 1].group]
        edges = [*firsts, len(points)]
        means = [
            float(np.exp(np.mean(np.log([p.typical_s for p in points[a:b]]))))
            for a, b in zip(edges[:-1], edges[1:], strict=True)
        ]
        steps = detect([Point(m, math.nan, math.nan) for m in means])
        return [replace(s, index=firsts[s.index]) if s.index < len(firsts) else s for s in steps]

    return pooled_detect


def pelt(points: list[Point], factor: float = 1.0) -> list[Step]:
    """The alternative: the partition minimising the squared error of the log times plus `factor` 2 sigma^2 ln n
    per step (1: the Schwarz criterion for Gaussian noise; sigma from consecutive differences, 1.4826 MAD / sqrt 2),
    the optimum PELT finds (ruptures' Pelt(model="l2"), computed here by plain dynamic programming), levels of 2
    runs or more but the newest; each step's ratio of the levels' means, a normal 95% interval, labels as steps.py
    gives them."""
    logs = np.log([p.typical_s for p in points])
    n = len(logs)
    if n < 4:
        return [Step(0, math.nan, math.nan, math.nan, Label.INSUFFICIENT)]
    diffs = np.diff(logs)
    sigma = max(1.4826 * float(np.median(np.abs(diffs - np.median(diffs)))) / math.sqrt(2), 1e-3)
    penalty = factor * 2 * sigma**2 * math.log(n)
    total, squares = np.concatenate([[0], np.cumsum(logs)]), np.concatenate([[0], np.cumsum(logs**2)])
    best, previous = np.full(n + 1, np.inf), np.zeros(n + 1, dtype=int)
    best[0] = -penalty
    for end in range(2, n + 1):
        starts = np.arange(0, end - (1 if end == n else 2) + 1)
        cost = squares[end] - squares[starts] - (total[end] - total[starts]) ** 2 / (end - starts)
        totals = best[starts] + cost + penalty
        pick = int(np.argmin(totals))
        best[end], previous[end] = totals[pick], starts[pick]
    cuts, end = [], n
    while end > 0:
        end = int(previous[end])
        cuts.append(end)
    edges = [*sorted(cuts), n]
    steps = []
    for a, b, c in zip(edges[:-2], edges[1:-1], edges[2:], strict=True):
        size = logs[b:c].mean() - logs[a:b].mean()
        half = 1.96 * sigma * math.sqrt(1 / (b - a) + 1 / (c - b))
        label = Label.SUSPICIOUS if b == n - 1 else Label.REGRESSION if size > 0 else Label.IMPROVEMENT
        steps.append(Step(b, math.exp(size), math.exp(size - half), math.exp(size + half), label))
    return steps


OTAVA = {"window_len": 50, "max_pvalue": 0.001, "min_magnitude": 0.0}  # Otava's defaults (otava.series)


def otava(points: list[Point]) -> list[Step]:
    """The independent detector: Apache Otava's change points in the log times at its defaults (OTAVA), each a
    step whose ratio is exp of the difference of the means either side that Otava reports; Otava gives no interval
    (NaN); labels as steps.py gives them."""
    from otava.analysis import compute_change_points  # benchmark-only: see the module's docstring

    logs = [math.log(p.typical_s) for p in points]
    if len(logs) < 4:
        return [Step(0, math.nan, math.nan, math.nan, Label.INSUFFICIENT)]
    change_points, _ = compute_change_points(logs, **OTAVA)
    steps = []
    for point in change_points:
        at, size = int(point.index), float(point.stats.mean_2 - point.stats.mean_1)
        label = Label.SUSPICIOUS if at == len(logs) - 1 else Label.REGRESSION if size > 0 else Label.IMPROVEMENT
        steps.append(Step(at, math.exp(size), math.nan, math.nan, label, float(point.stats.pvalue)))
    return steps


DETECTORS = {"steps.py": find_steps, "Otava": pooled(otava), "PELT": pooled(pelt)}


def score(truth: Truth, steps: list[Step]) -> tuple[bool, int | None, bool | None, int]:
    """(found, position error in points, the interval holds the true ratio (None: no interval), other steps reported)
    of one series."""
    reported = [s for s in steps if s.label != Label.INSUFFICIENT]
    if truth.at is None:
        return False, None, False, len(reported)
    at = truth.point(truth.at)
    wanted = Label.SUSPICIOUS if at == truth.length - 1 else None
    near = [
        s
        for s in reported
        if abs(truth.point(s.index) - at) <= WINDOW
        and (s.ratio > 1) == (truth.ratio > 1)
        and (wanted is None or s.label == wanted)
    ]
    match = min(near, key=lambda s: abs(truth.point(s.index) - at), default=None)
    if match is None:
        return False, None, False, len(reported)
    held = match.low <= truth.ratio <= match.high if math.isfinite(match.low) else None
    return True, abs(truth.point(match.index) - at), held, len(reported) - 1


def measure(series: list[Truth], find: Callable[[list[Point]], list[Step]]) -> dict[str, float]:
    """One detector on a scenario's series: the share found, other steps per 100 points (runs, or sweeps where a
    sweep's runs are one point; and its standard error, over series), the mean position error and the share exact
    (of those found), the share whose interval holds the true ratio (of those found with an interval)."""
    scores = [score(t, find(t.points)) for t in series]
    found = [s for s in scores if s[0]]
    errors = [s[1] for s in found if s[1] is not None]
    held = [s[2] for s in found if s[2] is not None]
    per_100 = 100 * np.array([s[3] for s in scores]) / np.mean([t.length for t in series])
    nan = math.nan
    return {
        "found": len(found) / len(series),
        "other": float(per_100.mean()),
        "other_se": float(per_100.std(ddof=1) / math.sqrt(len(series))),
        "error": float(np.mean(errors)) if errors else nan,
        "exact": float(np.mean([e == 0 for e in errors])) if errors else nan,
        "held": float(np.mean(held)) if held else nan,
    }


def run(trials: int, seed: int) -> list[list[str]]:
    """The table's rows: noise, scenario, then per column each detector's figure: runs made apart, then sweeps of
    replicates (store-shaped, SWEEP_SCENARIOS), each on normal and heavy noise."""
    rows = []
    shapes = (("", simulate, SCENARIOS, 0), ("sweeps, ", simulate_sweeps, SWEEP_SCENARIOS, len(SCENARIOS)))
    for shape, draw, scenarios, offset in shapes:
        for heavy in (False, True):
            for number, (name, size, where) in enumerate(scenarios):
                rng = np.random.default_rng([seed, heavy, offset + number])
                series = [draw(rng, size, where, heavy) for _ in range(trials)]
                rows.append(_row(f"{shape}{'heavy' if heavy else 'normal'}", name, series, size, where))
                print(" | ".join(rows[-1]), flush=True)
    return rows


def _row(noise: str, name: str, series: list[Truth], size: float, where: str) -> list[str]:
    results = [measure(series, find) for find in DETECTORS.values()]
    has_step = bool(size) and where != "drift"
    return [
        noise,
        name,
        _column(results, lambda r: f"{r['found']:.0%}", has_step),
        _column(results, lambda r: f"{r['other']:.2f}"),
        f"{results[0]['other_se']:.2f}",
        _column(results, lambda r: f"{r['error']:.2f} ({r['exact']:.0%})" if r["found"] else "-", has_step),
        _column(results, lambda r: f"{r['held']:.0%}" if r["held"] == r["held"] else "-", has_step),
    ]


def _column(results: list[dict[str, float]], text: Callable[[dict[str, float]], str], wanted: bool = True) -> str:
    return " / ".join(text(r) for r in results) if wanted else ""


HEADER = (
    "noise",
    "scenario",
    "found",
    "other steps /100 points",
    "its standard error (steps.py)",
    "position error, runs (exact)",
    "interval holds",
)


def section(rows: list[list[str]], args: argparse.Namespace) -> str:
    lines = [
        BEGIN,
        "## History: finding steps",
        "",
        f"Regenerate: `.venv/bin/python benchmarks/history_sim.py --trials {args.trials} --seed {args.seed} --write` "
        "(rewrites this table, not the choice below it; about 10 minutes on this 2-core VM; Otava installed as "
        "benchmarks/history_sim.py's docstring says). "
        f"{args.trials} simulated series a scenario, 30-60 runs each, with a known step, a drift or neither "
        "(benchmarks/history_sim.py's docstring). The noise of a run, log-normal: the machine's drift between runs "
        f"made apart, sd {APART_SD:.0%} (ratio.APART_SD, from the A/A of `runner compare` above), its worker "
        f"process's offset, sd {PROCESS_SD:.1%} (ratio.PROCESS_SD: the A/A sweeps' *step 1* rows, 0.3-1.9%), and "
        f"its own spread, sd {OWN_SD[0]:.1%}-{OWN_SD[1]:.0%} (the A/A sweeps' interval half-widths, +-1.8-5% on a "
        "ratio of two jobs), which is all its interval holds. *heavy*: besides, 1 run in 12 moves a further 10-30% "
        "either way (the A/A apart: one pair of TensorFlow sweeps of six moved 29% together, torch 18% in an "
        "earlier run). *runs correlated 0.3*: the drift between runs an AR(1) series, 0.3 at lag 1. "
        "*step 5%, 10 runs after*: the series cut 10 runs after the step (20-50 runs before it); *20 runs after*: "
        "likewise, 10-40 before. "
        f"*sweeps* (issue 81's store-shaped series): {SWEEPS[0]}-{SWEEPS[1]} sweeps of {SEEDS[0]}-{SEEDS[1]} runs "
        "measured together (seeds, processes: the sweep's drift shared, each run its process offset and own spread), "
        f"each run's interval claiming an sd of {WIDE_SD[0]:.0%}-{WIDE_SD[1]:.0%} (within-run noise, wider than the "
        f"{APART_SD:.0%} scatter between sweeps), a load that comes and goes (a sweep starts one with chance "
        f"{LOAD[0]:.0%}, it lasts {LOAD[1][0]}-{LOAD[1][1]} sweeps and slows them {LOAD[2][0]:.0%}-{LOAD[2][1]:.0%}) "
        f"and a drift of up to {DRIFT:.0%} either way over the series; *heavy*: 1 sweep in 12 moves 10-30%; the step "
        "placed at a sweep, 3 or more from the first; *at the 7th of 12 sweeps, 2 seeds*: the issue's shape. There "
        "a point is a sweep: steps.py groups the runs itself (Point.group), Otava and PELT are given each sweep's "
        "geometric mean, *found* is within 3 sweeps and *other steps* are per 100 sweeps (2-4 runs each). "
        "Each cell: " + " / ".join(DETECTORS) + ": runner.history.steps; Apache Otava 0.8.0's change points "
        "(`otava.analysis.compute_change_points` on the log times at its defaults: window 50, p <= 0.001, no "
        "minimum magnitude; it gives no interval); PELT's optimum of squared error with the Schwarz penalty "
        "(2 sigma^2 ln n a step). *found*: a step the same way reported within "
        f"{WINDOW} runs of the true one (with 1 run after it: labelled suspicious); *other steps*: every "
        "other step reported, per 100 runs (sweeps in the *sweeps* rows): false alarms, except on a drift, a real "
        "change without a step; its "
        "standard error over the series is given for steps.py (a share *found* near 50% has one of "
        f"{50 / math.sqrt(args.trials):.1f} points, near 90% {30 / math.sqrt(args.trials):.1f}); "
        "*position error*: runs between the found step and the true one (mean; exactly placed in brackets); "
        "*interval holds*: the found step's 95% interval holds the true ratio.",
        "",
        "| " + " | ".join(HEADER) + " |",
        "|" + "---|" * len(HEADER),
    ]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join([*lines, END])


QUIET, REAL, FDR_RATE = 100, 5, 0.05  # --stores: a store's series with no step and with a real 10% step; the rate
STORE_BEGIN, STORE_END = "<!-- history-fdr:begin -->", "<!-- history-fdr:end -->"
STORE_NOISES = (
    ("normal", False, "interior"),
    ("heavy", True, "interior"),
    ("runs correlated 0.3", False, "correlated"),
    ("sweeps (store-shaped)", False, "sweeps"),
    ("sweeps, heavy", True, "sweeps"),
)
STORE_HEADER = (
    "noise",
    "false alerts a store",
    "stores with a false alert",
    "real steps found",
    "false share of alerts (mean)",
    "quiet series with p <= 0.05 / 0.01",
)


def store(rng: np.random.Generator, heavy: bool, where: str) -> tuple[list[Truth], list[History]]:
    """One store: QUIET series with no step, then REAL with a 10% step, each with the steps its fit found; where
    `where` is "sweeps", store-shaped series (simulate_sweeps)."""
    draw = simulate_sweeps if where == "sweeps" else simulate
    truths = [draw(rng, 0.0, "interior" if where == "sweeps" else where, heavy) for _ in range(QUIET)]
    truths += [draw(rng, 0.10, "interior", heavy) for _ in range(REAL)]
    histories = []
    for i, truth in enumerate(truths):
        entries = [Entry(f"{i}-{j}", float(j), p.typical_s) for j, p in enumerate(truth.points)]
        histories.append(History(str(i), str(i), "m", "m", entries, find_steps(truth.points)))
    return truths, histories


def store_counts(truths: list[Truth], histories: list[History]) -> tuple[int, int, float]:
    """(false alerts, real steps found, false share of the alerts) among the steps kept (significant)."""
    kept = [[s for s in h.steps if s.significant] for h in histories]
    false = sum(len([s for s in steps if s.label != Label.INSUFFICIENT]) for steps in kept[:QUIET])
    found = sum(score(truth, steps)[0] for truth, steps in zip(truths[QUIET:], kept[QUIET:], strict=True))
    real_other = sum(score(truth, steps)[3] for truth, steps in zip(truths[QUIET:], kept[QUIET:], strict=True))
    alerts = false + found + real_other
    return false, found, (false + real_other) / alerts if alerts else 0.0


def run_stores(count: int, seed: int) -> list[list[str]]:
    """The store table's rows: per noise, each figure as each series alone / held to FDR_RATE together."""
    rows = []
    for number, (name, heavy, where) in enumerate(STORE_NOISES):
        rng = np.random.default_rng([seed, 99, number])
        alone, held, smallest = [], [], []
        for _ in range(count):
            truths, histories = store(rng, heavy, where)
            alone.append(store_counts(truths, histories))
            smallest += [min((s.p_value for s in h.steps), default=1.0) for h in histories[:QUIET]]
            control_fdr(histories, FDR_RATE)
            held.append(store_counts(truths, histories))
        a, b, p = np.array(alone), np.array(held), np.array(smallest)
        rows.append(
            [
                name,
                f"{a[:, 0].mean():.2f} / {b[:, 0].mean():.2f}",
                f"{np.mean(a[:, 0] > 0):.0%} / {np.mean(b[:, 0] > 0):.0%}",
                f"{a[:, 1].mean() / REAL:.0%} / {b[:, 1].mean() / REAL:.0%}",
                f"{a[:, 2].mean():.1%} / {b[:, 2].mean():.1%}",
                f"{np.mean(p <= 0.05):.1%} / {np.mean(p <= 0.01):.1%}",
            ]
        )
        print(" | ".join(rows[-1]), flush=True)
    return rows


def store_section(rows: list[list[str]], args: argparse.Namespace) -> str:
    lines = [
        STORE_BEGIN,
        "## History: many cases at once",
        "",
        f"Regenerate: `.venv/bin/python benchmarks/history_sim.py --stores {args.stores} --seed {args.seed} --write` "
        f"(rewrites this table; about 3 minutes on this 2-core VM). {args.stores} simulated stores a row, each of "
        f"{QUIET} series with no step and {REAL} with a real 10% step (slower or faster, 5 runs or more from either "
        "end), 30-60 runs a series, drawn as the table above draws them (*sweeps*: its store-shaped series, 12-30 "
        "sweeps of 2-4 runs, the load and the drift drawn for each series apart). Each figure: as each series alone "
        "reports "
        f"its steps / held together to a false-discovery rate of {FDR_RATE:.0%} (`runner history`'s default: "
        "Benjamini-Hochberg over the steps' p-values, runner.history.build). *false alerts*: steps in the quiet "
        "series; *real steps found*: a step the same way within 3 runs of the true one; *false share*: the false "
        "steps among all those kept, per store, averaged (the false-discovery rate BH bounds); the last column, "
        "without any adjustment: the share of quiet series whose smallest step p-value is at most 0.05 and 0.01 "
        "(a series with no step: p = 1), which an honest p-value keeps at or below 5% and 1%.",
        "",
        markdown(STORE_HEADER, rows).rstrip("\n"),
    ]
    return "\n".join([*lines, STORE_END])


NIGHT_CASES, NIGHTS, FIRST_GATED, NEWEST = 6, 36, 7, 3  # --nights: cases a store, nights, the first gated, new-within
NIGHT_STEP = (0, 20, 0.10)  # the case, the night and the size of the one real step of each store
NIGHTS_BEGIN, NIGHTS_END = "<!-- history-nights:begin -->", "<!-- history-nights:end -->"
NIGHTS_HEADER = ("noise", "nights gated", "false nights", "share", "the 10% step failed the gate within 3 nights")


def night_store(rng: np.random.Generator, heavy: bool) -> list[tuple[str, str, str, str, Entry]]:
    """One store of NIGHT_CASES cases, a run of each every night (a sweep of its own), drawn as simulate_sweeps
    draws a sweep (one seed), the load that comes and goes shared by the night's cases; NIGHT_STEP's case 10% slower
    from its night on."""
    load = _load(rng, NIGHTS)
    rows = []
    for case in range(NIGHT_CASES):
        shared = rng.normal(0, APART_SD, NIGHTS) + load + np.linspace(0, rng.uniform(-DRIFT, DRIFT), NIGHTS)
        if case == NIGHT_STEP[0]:
            shared[NIGHT_STEP[1] :] += math.log1p(NIGHT_STEP[2])
        if heavy:
            moved = rng.random(NIGHTS) < HEAVY[0]
            shared += moved * rng.choice([-1, 1], NIGHTS) * np.log1p(rng.uniform(HEAVY[1], HEAVY[2], NIGHTS))
        own = np.exp(rng.uniform(math.log(OWN_SD[0]), math.log(OWN_SD[1]), NIGHTS))
        logs = math.log(1e-3) + shared + rng.normal(0, PROCESS_SD, NIGHTS) + rng.normal(0, own)
        for night, y in enumerate(logs):
            entry = Entry(f"{case}-{night}", 86_400.0 * night, math.exp(y), sweep=f"night{night}")
            rows.append((str(case), f"case {case}", "m", "m", entry))
    return rows


def gate_nights(rows: list[tuple[str, str, str, str, Entry]]) -> tuple[int, int, bool]:
    """(nights gated, nights the gate failed falsely, the real step failed it within 3 nights of its own): the gate
    as the nightly recipe runs it (`runner history --fail-on regression --new-within 3`), night by night."""
    false, caught = 0, False
    for night in range(FIRST_GATED, NIGHTS):
        histories = build([row for row in rows if row[4].started <= 86_400.0 * night])
        failed = {h.case for h, _ in failing_steps(recent(histories, NEWEST), {str(Label.REGRESSION)})}
        real = str(NIGHT_STEP[0]) in failed and night >= NIGHT_STEP[1]
        false += bool(failed - {str(NIGHT_STEP[0])}) or (bool(failed) and not real)
        caught |= real and night < NIGHT_STEP[1] + NEWEST
    return NIGHTS - FIRST_GATED, false, caught


def run_nights(count: int, seed: int) -> list[list[str]]:
    """The nights table's rows: per noise, the nights gated, those that failed falsely, and the real steps caught."""
    rows = []
    for heavy in (False, True):
        rng = np.random.default_rng([seed, 77, heavy])
        results = np.array([gate_nights(night_store(rng, heavy)) for _ in range(count)])
        gated, false = int(results[:, 0].sum()), int(results[:, 1].sum())
        rows.append(
            [
                "heavy" if heavy else "normal",
                str(gated),
                str(false),
                f"{false / gated:.1%} (1 in {gated / max(false, 1):.0f})",
                f"{results[:, 2].mean():.0%}",
            ]
        )
        print(" | ".join(rows[-1]), flush=True)
    return rows


def nights_section(rows: list[list[str]], args: argparse.Namespace) -> str:
    lines = [
        NIGHTS_BEGIN,
        "## History: the nightly gate on simulated nights",
        "",
        f"Regenerate: `.venv/bin/python benchmarks/history_sim.py --nights {args.nights} --seed {args.seed} --write` "
        f"(rewrites this table; a few minutes on this 2-core VM). {args.nights} simulated stores a row, each of "
        f"{NIGHT_CASES} cases with a run every night for {NIGHTS} nights, each night's runs drawn as the *sweeps* rows "
        "of *History: finding steps* draw a sweep (the machine's drift between nights, a load that comes and goes, "
        f"shared by the night's cases, a drift over the nights), case {NIGHT_STEP[0]} {NIGHT_STEP[2]:.0%} slower "
        f"from night {NIGHT_STEP[1]} on. From night {FIRST_GATED} on, each night the gate as the nightly "
        f"recipe runs it, on the runs up to that night: `runner history --fail-on regression --new-within {NEWEST}` "
        "(runner.history.build: build, recent, failing_steps; the store's false-discovery rate at its default). A "
        "night fails falsely where a case with no step fails it, or the stepped case before its step. *heavy*: 1 "
        "night in 12 moves a case 10-30%.",
        "",
        markdown(NIGHTS_HEADER, rows).rstrip("\n"),
    ]
    return "\n".join([*lines, NIGHTS_END])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=500, help="series per scenario")
    parser.add_argument("--seed", type=int, default=2026)
    parser.add_argument("--write", action="store_true", help="rewrite its section of BENCHMARKS.md")
    parser.add_argument("--stores", type=int, default=0, help="simulate this many stores of many cases instead")
    parser.add_argument("--nights", type=int, default=0, help="simulate this many stores' nightly gates instead")
    args = parser.parse_args()
    if args.nights:
        print(" | ".join(NIGHTS_HEADER))
        rows = run_nights(args.nights, args.seed)
        if args.write:
            path = ROOT / "BENCHMARKS.md"
            path.write_text(replace_section(path.read_text(), nights_section(rows, args), NIGHTS_BEGIN, NIGHTS_END))
            print(f"wrote {path}")
        return
    if args.stores:
        print(" | ".join(STORE_HEADER) + "  (each: alone / held to the rate)")
        rows = run_stores(args.stores, args.seed)
        if args.write:
            path = ROOT / "BENCHMARKS.md"
            path.write_text(replace_section(path.read_text(), store_section(rows, args), STORE_BEGIN, STORE_END))
            print(f"wrote {path}")
        return
    print(" | ".join(HEADER) + "  (each: " + ", ".join(DETECTORS) + ")")
    rows = run(args.trials, args.seed)
    if args.write:
        path = ROOT / "BENCHMARKS.md"
        path.write_text(replace_section(path.read_text(), section(rows, args), BEGIN, END))
        print(f"wrote {path}")


if __name__ == "__main__":
    main()

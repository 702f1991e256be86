"""The one comparison: which runs did the same work, what a run's typical time is, and how much slower or faster one
is than a baseline, with its interval, its resolution and a verdict. Every table, plot, MLflow run and `runner
compare` asks this module; the statistics beneath it are runner.report.ratio's.

- The same work (runner.identity.work, as is a run's configuration): the model and task, the batch size and the
  numeric settings of the model and its inputs. Everything else (backend, mode, device, dtype, named alternatives
  such as model.arch) is what a comparison is for.
- The typical time (Timings.typical_s): a run's is the median over its rounds of each turn's fastest block
  (runner.measure.samples.typical_s); a configuration's, the geometric mean of its replicates' (runs of one
  configuration: other seeds, other nodes). The ratio of two typical times is what a comparison reports (or agrees
  with, see below).
- The ratio and its interval: runner.report.ratio.time_ratio over the rounds. Two runs measured in the same rounds
  get the geometric mean of their per-round ratios, in which the machine's drift from round to round cancels; it
  agrees with their typical times' ratio to within noise. Where it does not (the typical times' ratio outside its
  interval, or beyond UNSTABLE_DISAGREE), the page would show two figures that contradict each other: there is no
  verdict, and the reason gives both (rare in simulation: 0 of 600 busy 1.1x pairs; seen on a busy machine). Centring it
  on the typical times instead called identical jobs different 1 in 11 rather than 1 in 20 (tests/test_ratio.py).
  Where replicates are pooled, or runs were measured apart (`apart`, or no rounds shared: two sweeps, two blocks, two
  separate runs, whatever their hosts are called; unpaired, the machine's drift between them added, ratio.APART_SD),
  the rounds give the width and the typical times the centre: replicates that stall in different rounds move the
  pooled rounds, not their own typical times.
- Several nodes (a cluster sweep blocked by node: each node measured every configuration in its own interleaved
  rounds): a configuration's replicates on each node are paired with its baseline's there, so a node's own speed
  cancels, and the nodes are pooled as replicates; the interval adds how much the ratio moves from node to node
  (ratio.node_spread, measured, pooled with the stated NODE_SD where the nodes are few), so more nodes narrow it.
- Calls too long for rounds (a generation at a real decoder's size fills the budget: one round and no interval, or
  fewer than MIN_BATCHES rounds, whose t has one to six degrees of freedom: two rounds gave identical generations
  [0.08-11.4x]): where the task times a call's repeated parts (Task.repeated_parts: a generation's decode steps), the
  parts compare instead. Each position of each round is a round of its own, in blocks of PART_BLOCK consecutive parts
  whose fastest stands for the block, paired by round and position; the ratio is then of a part's time ("1.3x a
  token"), its interval over the blocks with the processes' spread added, as for rounds. It says so ('1 round x 15
  parts of a call'), and it is not centred on the whole calls' typical times, which a single stalled first token
  moves. One turn each cannot see what else ran in the other's turn: where the machine was busy, a difference stays
  "cannot tell", and a job of fewer than MIN_RANK_SAMPLES whole calls has not enough samples to be ranked (a busy
  gpt2 sweep ranked torch's one generation at 0.17x a token [0.00-7.52] beside its 1.64 s against jax's 164 ms).
- The verdict (Verdict) and its reason, in one vocabulary: fastest (the baseline), within noise, slower, faster,
  no change (real, but under `factor`: asv compare's rule), cannot tell (why), unstable (why).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import cast

import numpy as np

from runner.measure.machine_load import was_busy
from runner.report.ratio import (
    APART_SD,
    ASSUMED,
    MIN_BATCHES,
    PROCESS_SD,
    UNSTABLE_DISAGREE,
    ProcessSpread,
    Ratio,
    node_spread,
    process_spread,
    time_ratio,
)
from runner.report.rounds_order import rounds_order
from runner.report.statistics import LEVEL
from runner.report.timings import Timings

BUSY_FACTOR = 2.0  # what load alone made of one call's time here: the same matmul took 2x beside a burner


class Verdict(StrEnum):
    """What a comparison says of a run against its baseline; `Comparison.words` adds the reason."""

    FASTEST = "fastest"  # the baseline itself: the lowest typical time among those doing the same work
    WITHIN_NOISE = "within noise"  # the interval holds 1
    SLOWER = "slower"  # the interval lies above 1 (and beyond the factor, where one is asked)
    FASTER = "faster"
    NO_CHANGE = "no change"  # real, but smaller than the factor asked (runner compare --factor)
    CANNOT_TELL = "cannot tell"  # no interval: one round, no samples, an unstable baseline, a busy machine
    UNSTABLE = "unstable"  # this run's rounds disagree too much for a verdict


@dataclass(frozen=True)
class Comparison:
    """A run's (or a configuration's) time against its baseline's."""

    ratio: float  # its typical time / the baseline's
    low: float  # the interval (NaN where there is none)
    high: float
    verdict: Verdict
    reason: str | None = None
    basis: str | None = None  # what the interval rests on: '40 rounds', '1 round', '12 rounds, 1 of 4 comparisons'
    resolution: float = math.nan  # the smallest difference it calls 9 times in 10 (0.05: 5%)
    is_baseline: bool = False  # the fastest itself, which the others are compared with (FASTEST, or UNSTABLE)
    of_parts: bool = False  # the ratio is of a part's time (Task.part: "a token"), too few whole calls fitting
    ranked: bool = True  # False: too few samples to rank (MIN_RANK_SAMPLES): listed, never drawn or ordered

    def words(self) -> str:
        """The verdict as every table prints it: 'within noise', 'cannot tell (1 round)', 'unstable: ...'."""
        if not self.reason:
            return str(self.verdict)
        return (
            f"{self.verdict}: {self.reason}" if self.verdict == Verdict.UNSTABLE else f"{self.verdict} ({self.reason})"
        )


def compare(
    run: Timings,
    baseline: Timings,
    comparisons: int = 1,
    spread: ProcessSpread = ASSUMED,
    apart: bool = False,
    factor: float = 1.0,
    baseline_name: str = "the baseline",
) -> Comparison:
    """`run` against `baseline`: their typical times' ratio, its interval (at 1 - 0.05 / comparisons, holding the
    spread between worker processes; `apart`: measured in different sweeps), resolution and verdict. A difference
    under `factor` is called NO_CHANGE; a reason that is the baseline's calls it `baseline_name`."""
    by_typical = run.typical_s() / baseline.typical_s()
    if not (run.ranked() and baseline.ranked()):
        few = run.too_few() or "the fastest has not enough samples"
        return Comparison(by_typical, math.nan, math.nan, Verdict.CANNOT_TELL, few, ranked=run.ranked())
    apart = apart or measured_apart(run, baseline)
    if not run.replicates or not baseline.replicates:  # the replicates' medians may still disagree
        why = run.instability()
        return Comparison(
            by_typical, math.nan, math.nan, *((Verdict.UNSTABLE, why) if why else (Verdict.CANNOT_TELL, "no samples"))
        )
    over, parts = _ratio(run, baseline, comparisons, spread, apart)
    # no verdict where the rounds disagree; the resolution stays (the rounds launcher plans by it)
    no_verdict = functools.partial(
        Comparison, by_typical, math.nan, math.nan, basis=over.basis(), resolution=over.resolution
    )
    unsteady = run.instability() or baseline.instability()
    if unsteady and not apart and (order := order_over_rounds(run, baseline, comparisons, unsteady)):
        return order
    if why := run.instability():
        return no_verdict(Verdict.UNSTABLE, why)
    if baseline.instability():
        return no_verdict(Verdict.CANNOT_TELL, "the baseline is unstable")
    pooled = apart or len(run.replicates) > 1 or len(baseline.replicates) > 1
    outside = not (pooled or parts or math.isnan(over.low) or over.low <= by_typical <= over.high)
    disagree = not parts and max(over.value / by_typical, by_typical / over.value) > UNSTABLE_DISAGREE
    if outside or disagree:
        why = f"{over.value:.2f}x over its rounds, {by_typical:.2f}x by the typical times"
        return no_verdict(Verdict.UNSTABLE, why)
    value, low, high = over.value, over.low, over.high
    if pooled and not parts:  # centred on the typical times (see above)
        value, low, high = by_typical, low * by_typical / over.value, high * by_typical / over.value
    verdict, reason = _verdict(value, low, high, factor, over.basis())
    if verdict == Verdict.CANNOT_TELL and len(baseline.rounds()[1]) < len(run.rounds()[1]):
        reason = f"{baseline_name} took {reason}"  # '1 round' counts the side of fewer rounds: not this run's
    if (apart or parts) and verdict in (Verdict.SLOWER, Verdict.FASTER):
        verdict, reason = _unless_busy(verdict, reason, (low, high), max(run.busy, baseline.busy))
    return Comparison(value, low, high, verdict, reason, over.basis(), over.resolution, of_parts=parts is not None)


def order_over_rounds(run: Timings, baseline: Timings, comparisons: int, why: str) -> Comparison | None:
    """Where a side's rounds disagree (a busy machine), the order its paired rounds agree on (runner.report.
    rounds_order), beside the typical times' ratio, the figure every table shows: an order where its interval holds
    that ratio ('slower (in 39 of 39 paired rounds, at least 1.68x; though ...)'), else None: no reliable order."""
    mine, theirs = (
        dict(zip(numbers.tolist(), times, strict=True))
        for times, numbers in (run.rounds(tame=False), baseline.rounds(tame=False))
    )
    order = rounds_order(mine, theirs, 1 - (1 - LEVEL) / comparisons)
    by_typical = run.typical_s() / baseline.typical_s()
    if order is None or not order.low <= by_typical <= order.high:
        return None
    bound = f"at least {order.low:.3g}x" if order.slower else f"at least {1 / order.high:.3g}x faster"
    reason = f"in {order.agreeing} of {order.rounds} paired rounds, {bound}; though {why}"
    verdict = Verdict.SLOWER if order.slower else Verdict.FASTER
    return Comparison(by_typical, order.low, order.high, verdict, reason, f"{order.rounds} rounds, sign test")


def _unless_busy(
    verdict: Verdict, reason: str | None, interval: tuple[float, float], busy: float
) -> tuple[Verdict, str | None]:
    """Runs measured apart differ by what else ran (the same matmul took 2x beside a process burning a core,
    BENCHMARKS.md), which no interval over their rounds can see; nor can the parts of one turn each see what else ran
    in the other's turn (identical generations came out 0.70x [0.61-0.81] on a busy machine). Where the machine was
    busy, a difference that load alone could make (an interval reaching within BUSY_FACTOR of 1) is no verdict."""
    if not load_could_make(interval, busy):
        return verdict, reason
    return Verdict.CANNOT_TELL, f"looks {verdict}, but the machine was busy: {busy:.1f} other runnable"


def load_could_make(interval: tuple[float, float], busy: float) -> bool:
    """Whether a ratio with this interval is one that load alone could make: the machine was busy (`busy`, other
    runnable threads on average: machine_load.was_busy) and the interval reaches within BUSY_FACTOR of 1. The
    comparisons' rule, and the history's for a step beside a level measured busy (runner.history.build)."""
    low, high = interval
    return was_busy(busy) and low < BUSY_FACTOR and high > 1 / BUSY_FACTOR


def _ratio(
    run: Timings, baseline: Timings, comparisons: int, spread: ProcessSpread, apart: bool
) -> tuple[Ratio, Ratio | None]:
    """The ratio over the rounds, or where they give no interval, over the calls' parts (its second value then)."""
    processes = (run.processes(), baseline.processes())
    sd, df = spread.sd, spread.df
    if apart:  # the interval adds sd^2 (1/p_run + 1/p_baseline): PROCESS_SD per process, APART_SD^2 once
        sd, df = math.sqrt(PROCESS_SD**2 + APART_SD**2 / (1 / processes[0] + 1 / processes[1])), math.inf
    over = time_ratio(
        *run.rounds(),
        *baseline.rounds(),
        comparisons,
        process_sd=sd,
        process_df=df,
        paired=not apart,
        processes=processes,
        nodes=None if apart else node_spread(run.by_host(), baseline.by_host()),
    )
    few = over.rounds < MIN_BATCHES  # the rounds' t has few degrees of freedom, or there is none (one round)
    parts = _over_parts(run, baseline, comparisons, sd, df, apart, processes) if few else None
    return parts or over, parts


def _over_parts(
    run: Timings, baseline: Timings, comparisons: int, sd: float, df: float, apart: bool, processes: tuple[int, int]
) -> Ratio | None:
    """The ratio over the repeated parts of the calls (a generation's decode steps), each position of each round
    taken as a round: where too few whole calls fit the budget for an interval over rounds, the parts still give
    one: the ratio of a part's time (a token's), which the typical times of whole calls need not match (a generation's
    first token is no decode step, and on a busy machine one stalled prefill moves one whole call). None where either
    has no parts."""
    mine, theirs = run.part_rounds(), baseline.part_rounds()
    if mine is None or theirs is None:
        return None
    over = time_ratio(*mine, *theirs, comparisons, process_sd=sd, process_df=df, paired=not apart, processes=processes)
    if math.isnan(over.low):
        return None
    rounds = set(run.rounds()[1]) & set(baseline.rounds()[1]) if not apart else run.rounds()[1]
    return replace(over, rounds=len(rounds), parts=int(np.shape(run.parts[0])[-1]))


def measured_apart(run: Timings, baseline: Timings) -> bool:
    """Whether the two shared no rounds: other sweeps, blocks or nodes (two runs made minutes apart by separate
    commands on one host among them), so they compare as runs measured apart."""
    if run.timed_in and baseline.timed_in:
        return not set(run.timed_in) & set(baseline.timed_in)
    return on_other_nodes(run, baseline)


def on_other_nodes(run: Timings, baseline: Timings) -> bool:
    """Whether the two were measured on different hosts only (a SLURM sweep with a node per job): their rounds met
    different machines, not the same moments of one, so they compare as runs measured apart."""
    hosts = set(run.by_host()), set(baseline.by_host())
    return bool(hosts[0] and hosts[1] and not hosts[0] & hosts[1])


def _verdict(ratio: float, low: float, high: float, factor: float, basis: str) -> tuple[Verdict, str | None]:
    if math.isnan(low):
        return Verdict.CANNOT_TELL, basis.split(",")[0]  # '1 round'
    if low <= 1.0 <= high:
        return Verdict.WITHIN_NOISE, None
    if max(ratio, 1 / ratio) < factor:
        return Verdict.NO_CHANGE, f"under {factor:.2f}x"
    return (Verdict.SLOWER if ratio > 1 else Verdict.FASTER), None


def versus_fastest(candidates: Sequence[Timings], configurations: Sequence[str]) -> list[Comparison]:
    """Each candidate (which did the same work) against the fastest of them, the one of lowest typical time (whose
    own Comparison says FASTEST, or UNSTABLE with why). The k - 1 intervals share 95% (Bonferroni: picking the
    fastest after seeing the data makes every other look slower), and hold the spread between worker processes that
    replicates show (`configurations` names each candidate's; candidates of one configuration are replicates)."""
    typical = [c.typical_s() if c.ranked() else math.inf for c in candidates]  # too few samples: never the fastest
    fastest = int(np.argmin(typical)) if not all(math.isinf(t) for t in typical) else 0
    jobs = [job for c in candidates for job in c.replicates]
    # replicates on one node share its rounds' moments; on several, each node's own speed is no process's offset
    names = [f"{name}@{host}" for c, name in zip(candidates, configurations, strict=True) for host in _hosts(c)]
    spread = process_spread(jobs, names) if jobs else ASSUMED
    out = [
        compare(candidate, candidates[fastest], len(candidates) - 1, spread, baseline_name="the fastest")
        if i != fastest
        else None
        for i, candidate in enumerate(candidates)
    ]
    others = [c for c in out if c is not None]
    why = candidates[fastest].instability()
    if why and others and all(c.verdict == Verdict.SLOWER for c in others):
        why = None  # its rounds disagree, yet every other was slower in the rounds they shared: it is the fastest
    if not candidates[fastest].ranked():  # none has samples enough
        out[fastest] = Comparison(1.0, math.nan, math.nan, Verdict.CANNOT_TELL,
                                  candidates[fastest].too_few(), is_baseline=True,
                                  ranked=False)  # fmt: skip
    else:
        out[fastest] = Comparison(1.0, math.nan, math.nan, Verdict.UNSTABLE if why else Verdict.FASTEST, why,
                                  is_baseline=True)  # fmt: skip
    return cast(list[Comparison], out)


def _hosts(timings: Timings) -> list[str]:
    return list(timings.hosts) if len(timings.hosts) == len(timings.replicates) else [""] * len(timings.replicates)

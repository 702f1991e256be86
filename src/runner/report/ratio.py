"""How much slower job A is than job B, with a 95% interval that accounts for the spread between rounds.

Each round gives one typical time per job: the fastest block of its turn (runner.measure.samples.turn_typical; a
block that lost its core runs slow, never fast). Jobs measured in the same rounds (interleaved: round r of A and
of B met the same phase of the machine) are compared round by round: the ratio is the geometric mean
of the per-round ratios, so the round-to-round drift of the machine cancels and its spread widens the
interval.

The interval is Student's t over batch means: consecutive rounds are grouped into batches (every round
its own batch up to MIN_BATCHES rounds, then MIN_BATCHES or sqrt(rounds) batches) and t runs over the
batches' means. Rounds close in time are not independent draws: on a busy machine the slow and fast
phases outlast a round, and per-round log ratios correlated up to 0.5 at lag 1 (BENCHMARKS.md). Over
single rounds, t then held the true ratio in about 85% of simulated sweeps (40 rounds, lag-1
correlation 0.3) instead of 95%; over batches, 94% (tests/test_ratio.py checks both).

All rounds count, busy or quiet: keeping only the quiet ones (no other process runnable during either
turn) was tried and made the ratio move more between repeats, not less, since it halved the rounds
under a neighbour that is busy half the time (BENCHMARKS.md). But a round whose log ratio lies beyond OUTLYING
robust sds of the others (a turn spent sharing a core throughout) is pulled in to that bound (`tamed`).

Jobs measured in different rounds fall back to Welch's t over the two sets of batch means. One round
gives the ratio of typical times and no interval. Jobs measured apart (two sweeps, hours or machines apart:
`runner compare`) add the spread of the machine's state between them, APART_SD, to the processes' own.

A worker process has its own lasting offset: identical jobs whose rounds agree closely (intervals over rounds of
+-1%) still came out up to 5% apart, each in its own process, because each process gets its own physical memory
placement (the address layout is fixed: runner.launch.isolation). Rounds cannot see an offset that lasts the
process's life, so the interval adds its spread (the way a measurement's systematic uncertainty is added to its
statistical one), divided by the job's processes: a job measured in P worker processes (timing.processes, its
turns handed to them in rotation) averages P offsets. The spread is measured in the sweep (process_spread): between
the processes of each job where jobs have several, else between replicates (jobs differing only in their seed),
pooled with PROCESS_SD; with neither, PROCESS_SD, from the A/A sweeps of BENCHMARKS.md.

What this module gives is the statistics; runner.report.comparison compares a run with its baseline through them.

Beside each interval, its resolution: the smallest difference the comparison calls 9 times in 10 (`spread`). A
sweep's rounds stop once every comparison resolves timing.resolve (runner.launch.rounds).

Comparing every job with the fastest, picked after seeing the data, is k - 1 comparisons at once, and the
pick makes every other job look slower: at 95% each, 1 identical job in 3 was called different in a
16-job A/A sweep. So the interval of each of the k - 1 ratios is at level 1 - 0.05 / (k - 1) (Bonferroni),
95% for the whole sweep; tests/test_ratio.py simulates identical sweeps and checks how many are called
different.

A job whose rounds disagree wildly gets no verdict (`unstable`): its per-round typical times spread more than
UNSTABLE_SPREAD (p90/p10: torch's two threads on two busy cores ran rounds 1-11 at 55 ms a call and the
rest at 0.45 ms), or the ratio over rounds and the ratio of its typical times differ by more than UNSTABLE_DISAGREE.

Why t rather than a bootstrap over rounds: with few rounds a percentile bootstrap has too few distinct
resamples; in a simulation (3 rounds, log-normal round effects) its 95% interval held the true ratio
80% of the time, t's 95%.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from runner.measure.samples import turn_typical, typical_s
from runner.report.statistics import LEVEL, pulled_in, student_quantile

MIN_BATCHES = 8
# Between worker processes, identical jobs' medians spread by this much (sd of their logs) however long they
# sample: each process has its own physical memory placement (BENCHMARKS.md, A/A sweeps: 0.3-1.9%).
PROCESS_SD = 0.012
PRIOR_DF = 4  # the weight of PROCESS_SD beside the spread a sweep's replicates show (process_spread)
# Between two sweeps run apart, the machine itself moves all of a sweep's jobs together: the A/A of runner
# compare (BENCHMARKS.md) put the sd of that shared log offset at about 3%.
APART_SD = 0.03
POWER = 0.9  # a comparison's resolution: the difference it calls this often
# Between nodes of one kind of machine, a configuration's ratio to its baseline moves by this much (sd of the log ratio,
# node x configuration): assumed where a sweep's nodes are too few to measure it (node_spread), as PROCESS_SD is.
NODE_SD = 0.01
UNSTABLE_SPREAD = 3.0  # p90/p10 of a job's per-round medians
UNSTABLE_DISAGREE = 1.25  # the ratio over rounds against the ratio of the medians


@dataclass(frozen=True)
class Ratio:
    value: float  # time of A / time of B
    low: float  # the 95% interval; NaN when there are too few rounds to tell
    high: float
    rounds: int  # the rounds the interval rests on (shared rounds when paired)
    paired: bool
    comparisons: int = 1  # made at once, the interval's level shared among them
    resolution: float = math.nan  # the smallest difference called 9 times in 10 at this spread (0.05: 5%)
    nodes: int = 1  # the nodes it pools, each a block that measured both (node_spread)
    parts: int = 0  # where it rests on the repeated parts of `rounds` calls (runner.report.comparison): parts a call

    def basis(self) -> str:
        """What the ratio rests on, for a person: '40 rounds', '1 round', '5 rounds, unpaired', '40 rounds,
        1 of 7 comparisons', '40 rounds on 3 nodes', '1 round x 15 parts of a call'."""
        unpaired = ", unpaired" if not self.paired and self.rounds > 1 else ""
        nodes = f" on {self.nodes} nodes" if self.nodes > 1 else ""
        shared = f", 1 of {self.comparisons} comparisons" if self.comparisons > 1 else ""
        parts = f" x {self.parts} parts of a call" if self.parts else ""
        return f"{self.rounds} round{'s' if self.rounds != 1 else ''}{parts}{nodes}{unpaired}{shared}"


def round_medians(samples_s: np.ndarray, rounds: np.ndarray | None) -> dict[int, float]:
    """The median sample of each round (all samples are round 1 where rounds were not recorded)."""
    samples_s = np.asarray(samples_s, dtype=float)
    rounds = np.ones(len(samples_s), dtype=int) if rounds is None else np.asarray(rounds)
    return {int(r): float(np.median(samples_s[rounds == r])) for r in np.unique(rounds)}


def batch_count(rounds: int) -> int:
    """How many batches of consecutive rounds the interval rests on (see the module's docstring)."""
    return min(rounds, max(MIN_BATCHES, math.isqrt(rounds)))


def tamed(logs: np.ndarray) -> np.ndarray:
    """Per-round log values with the outlying ones pulled in to the median +- OUTLYING robust sds (1.4826 MAD): a
    round in which one job shared its core for the whole turn (its fastest sample 2-3x the work, a busy
    machine's other sessions) moves the mean by its bound, not by its size. Rounds within the bounds, as all
    are on a machine that is not that busy, are left as measured."""
    logs = np.asarray(logs, dtype=float)
    if len(logs) < MIN_BATCHES:  # too few to tell an outlier
        return logs
    centre = np.median(logs)
    scale = 1.4826 * np.median(np.abs(logs - centre))
    return pulled_in(logs, centre, scale) if scale > 0 else logs


def batch_means(logs: np.ndarray) -> np.ndarray:
    """The means of consecutive per-round values in batch_count(len(logs)) batches, as even as they split."""
    return np.array([batch.mean() for batch in np.array_split(np.asarray(logs, dtype=float), batch_count(len(logs)))])


def time_ratio(
    samples_a: np.ndarray,
    rounds_a: np.ndarray | None,
    samples_b: np.ndarray,
    rounds_b: np.ndarray | None,
    comparisons: int = 1,
    process_sd: float = PROCESS_SD,
    paired: bool = True,
    process_df: float = math.inf,
    processes: tuple[int, int] = (1, 1),
    nodes: NodeSpread | None = None,
) -> Ratio:
    """A's time relative to B's, with its interval: 95% over `comparisons` such ratios made at once, the
    spread between worker processes (`process_sd`, log scale, estimated on `process_df` degrees of freedom;
    infinite: taken as known; A and B each averaging `processes` of them) included (see the module's docstring).
    `paired=False` for jobs measured apart, whose round numbers do not name the same moments. `nodes`: A and B are
    each pooled over the same nodes, each node a block that measured both in its own rounds (node_spread)."""
    spread = functools.partial(interval, process_sd=process_sd, process_df=process_df, processes=processes, nodes=nodes)
    on = nodes.nodes if nodes else 1
    a, b = turn_typical(samples_a, rounds_a), turn_typical(samples_b, rounds_b)
    shared = sorted(set(a) & set(b)) if paired else []
    level = 1 - (1 - LEVEL) / comparisons
    if len(shared) >= 2:
        logs = tamed(np.log([a[r] for r in shared]) - np.log([b[r] for r in shared]))
        batches = batch_means(logs)
        sem = batches.std(ddof=1) / math.sqrt(len(batches))
        half, resolution = spread(sem, len(batches) - 1, level)
        mean = logs.mean()
        return Ratio(
            math.exp(mean), math.exp(mean - half), math.exp(mean + half), len(shared), True, comparisons, resolution, on
        )
    log_a, log_b = tamed(np.log([a[r] for r in sorted(a)])), tamed(np.log([b[r] for r in sorted(b)]))
    if len(log_a) >= 2 and len(log_b) >= 2:
        mean = log_a.mean() - log_b.mean()
        batches_a, batches_b = batch_means(log_a), batch_means(log_b)
        var_a, var_b = batches_a.var(ddof=1) / len(batches_a), batches_b.var(ddof=1) / len(batches_b)
        sem = math.sqrt(var_a + var_b)
        n = min(len(a), len(b))
        if sem == 0 and process_sd == 0:
            return Ratio(math.exp(mean), math.exp(mean), math.exp(mean), n, False, comparisons, 0.0)
        df = math.inf  # where the rounds add no spread, only the processes' does
        if sem:
            df = (var_a + var_b) ** 2 / (var_a**2 / (len(batches_a) - 1) + var_b**2 / (len(batches_b) - 1))  # Welch
        half, resolution = spread(sem, df, level)
        return Ratio(math.exp(mean), math.exp(mean - half), math.exp(mean + half), n, False, comparisons, resolution)
    value = typical_s(samples_a, rounds_a) / typical_s(samples_b, rounds_b)
    return Ratio(value, math.nan, math.nan, min(len(a), len(b)), False, comparisons)


def half_width(sem: float, df: float, level: float, process_sd: float, process_df: float = math.inf) -> float:
    """Half the two-sided interval at `level` of a difference of two jobs' log times whose rounds give this
    standard error with these degrees of freedom, beside each job's process drawing its own offset with a
    spread `process_sd` known (process_df infinite) or estimated on process_df degrees of freedom (Student's t,
    degrees of freedom by Welch-Satterthwaite)."""
    return interval(sem, df, level, process_sd, process_df)[0]


def interval(
    sem: float,
    df: float,
    level: float,
    process_sd: float,
    process_df: float = math.inf,
    processes: tuple[int, int] = (1, 1),
    nodes: NodeSpread | None = None,
) -> tuple[float, float]:
    """half_width (each job averaging `processes` processes' offsets, and where it is pooled over nodes, the spread of
    its ratio from node to node over their number), and the resolution: the smallest difference (0.05: 5%) whose
    interval would exclude 1 in 9 comparisons of 10 at this spread, exp((t_level + t_0.9) * se) - 1 (the minimum
    detectable effect at 90% power)."""
    process = process_sd**2 * (1 / processes[0] + 1 / processes[1])
    node = nodes.variance_of_mean() if nodes else 0.0
    total = sem**2 + process + node
    terms = (sem**4 / df if sem else 0.0) + (process**2 / process_df if process else 0.0)
    terms += node**2 / nodes.df if nodes and node else 0.0
    df = total**2 / terms if terms else math.inf
    se, quantile = math.sqrt(total), student_quantile(df, (1 + level) / 2)
    return quantile * se, math.expm1((quantile + student_quantile(df, POWER)) * se)


@dataclass(frozen=True)
class ProcessSpread:
    """The sd of the lasting offset each worker process draws (log scale), on `df` degrees of freedom (inf:
    assumed, not measured), and where it comes from, for a person."""

    sd: float
    df: float
    basis: str
    measured: float = math.nan  # what the sweep alone showed


ASSUMED = ProcessSpread(PROCESS_SD, math.inf, f"assumed {PROCESS_SD:.1%} (one process a job, no replicates)")


@dataclass(frozen=True)
class NodeSpread:
    """How much a configuration's ratio to its baseline moves from node to node (sd, log scale, on `df` degrees of
    freedom), where both were measured on the same `nodes` nodes, each in its own interleaved rounds: the node is a
    block, its own speed cancels in its ratio, and what is left between nodes (node x configuration) is this."""

    sd: float
    df: float
    nodes: int
    measured: float = math.nan  # what the nodes alone showed (NaN: too few to say)

    def variance_of_mean(self) -> float:
        """Its share of the variance of the ratio pooled over the nodes (each node weighs the same)."""
        return self.sd**2 / self.nodes


def node_spread(run: Mapping[str, Sequence[Job]], baseline: Mapping[str, Sequence[Job]]) -> NodeSpread | None:
    """The node-to-node spread of A's ratio to B, from the nodes that measured both (`run` and `baseline`: each
    node's replicates of A and of B); None with fewer than 2 such nodes. Each node's log ratio is the mean over its
    shared rounds of each round's (geometric mean over replicates) ratio; their variance over nodes, less what the
    rounds' own noise explains (method of moments), is the node term. Few nodes know it poorly: it is pooled with
    NODE_SD as PRIOR_DF degrees of freedom, as process_spread pools PROCESS_SD."""
    hosts = sorted(set(run) & set(baseline))
    if len(hosts) < 2:
        return None
    means, noise = [], []
    for host in hosts:
        a, b = _pooled_rounds(run[host]), _pooled_rounds(baseline[host])
        shared = sorted(set(a) & set(b))
        if len(shared) < 2:
            return None
        logs = tamed(np.log([a[r] for r in shared]) - np.log([b[r] for r in shared]))
        batches = batch_means(logs)
        means.append(logs.mean())
        noise.append(batches.var(ddof=1) / len(batches))
    between = max(float(np.var(means, ddof=1)) - float(np.mean(noise)), 0.0)
    df = len(hosts) - 1
    sd = math.sqrt((PRIOR_DF * NODE_SD**2 + df * between) / (PRIOR_DF + df))
    return NodeSpread(sd, float(df + PRIOR_DF), len(hosts), math.sqrt(between))


def _pooled_rounds(jobs: Sequence[Job]) -> dict[int, float]:
    """Each round's typical time, the geometric mean over the replicates that took part in it."""
    turns = [turn_typical(job.seconds, job.rounds) for job in jobs]
    numbers = sorted(set().union(*turns))
    return {n: float(np.exp(np.mean([np.log(t[n]) for t in turns if n in t]))) for n in numbers}


@dataclass(frozen=True)
class Job:
    """A job's samples: seconds per call, and the round and the worker process of each (None: all round 1, process
    0)."""

    seconds: np.ndarray
    rounds: np.ndarray | None = None
    processes: np.ndarray | None = None


def process_count(job: Job) -> int:
    """The worker processes that took the job's samples (timing.processes): 1 where not recorded."""
    processes = job.processes
    return 1 if processes is None or not len(processes) else len(np.unique(processes))


def process_spread(jobs: Sequence[Job], configurations: list[str]) -> ProcessSpread:
    """The spread between worker processes, measured in the sweep, from the jobs measured in several processes
    (_within_jobs) where there are any, else from replicates (_between_replicates: jobs of one configuration,
    `configurations` naming each job's, seed aside), pooled with PROCESS_SD as PRIOR_DF degrees of freedom. With
    neither, PROCESS_SD is assumed."""
    between, df, units = _within_jobs(jobs)
    if not df:
        between, df, units = _between_replicates(jobs, configurations)
    if not df:
        return ASSUMED
    measured = math.sqrt(between / df)
    # Few processes know the spread poorly: pooled with PROCESS_SD as PRIOR_DF degrees of freedom (limma's
    # moderated variance), as t then has df + PRIOR_DF of them.
    sd = math.sqrt((PRIOR_DF * PROCESS_SD**2 + between) / (PRIOR_DF + df))
    return ProcessSpread(sd, float(df + PRIOR_DF), f"measured {measured:.1%} over {units} processes", measured)


def _within_jobs(jobs: Sequence[Job]) -> tuple[float, int, int]:
    """Between the processes of each job measured in several: the variance of their typical times (each the
    median over its turns, as the job's is over all), pooled over the jobs. A median is what a busy machine does
    not move (a third of the turns spent sharing a core, under two half-time burners, left it at the work), where
    a layout of every turn took those turns for processes' offsets. It holds each median's own noise too, so it
    errs on the wide side. Returns the variance times its degrees of freedom summed over the jobs, the degrees of
    freedom, and the processes."""
    between, df, units = 0.0, 0, 0
    for job in jobs:
        seconds, rounds, processes = job.seconds, job.rounds, job.processes
        if processes is None or rounds is None or process_count(job) < 2:
            continue
        typical = turn_typical(seconds, rounds)
        process_of = dict(zip(np.asarray(rounds).tolist(), np.asarray(processes).tolist(), strict=True))
        medians = [
            np.median(np.log([t for r, t in typical.items() if process_of[r] == p]))
            for p in sorted(set(process_of.values()))
        ]
        between += (len(medians) - 1) * float(np.var(medians, ddof=1))
        df, units = df + len(medians) - 1, units + len(medians)
    return between, df, units


def _between_replicates(jobs: Sequence[Job], configurations: list[str]) -> tuple[float, int, int]:
    """Between replicates, each in its own process: their per-round typical times, rounds shared, are a two-way
    layout (job + round + noise): the process variance is (MS_jobs - MS_noise) / rounds, the method of moments of a
    one-way random effect once each round's shared phase is taken out. Returns what _within_jobs does."""
    between, df, units = 0.0, 0, 0
    for name in dict.fromkeys(configurations):
        members = [turn_typical(jobs[i].seconds, jobs[i].rounds) for i, c in enumerate(configurations) if c == name]
        shared = sorted(set.intersection(*(set(m) for m in members))) if len(members) > 1 else []
        if len(shared) < MIN_BATCHES:
            continue
        logs = np.log([[m[r] for r in shared] for m in members])  # jobs x rounds
        logs = np.array([tamed(row) for row in logs - np.median(logs, axis=0)])  # each round's phase out
        resid = logs - logs.mean(axis=1, keepdims=True) - logs.mean(axis=0) + logs.mean()
        jobs_n, rounds_n = logs.shape
        ms_jobs = rounds_n * logs.mean(axis=1).var(ddof=1)
        ms_noise = (resid**2).sum() / ((jobs_n - 1) * (rounds_n - 1))
        between += (jobs_n - 1) * max(ms_jobs - ms_noise, 0.0) / rounds_n
        df, units = df + jobs_n - 1, units + jobs_n
    return between, df, units

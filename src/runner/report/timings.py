"""One side of a comparison (runner.report.comparison): a run, or a configuration's replicates pooled, as their
samples say: its typical time, its rounds (and a call's repeated parts taken as rounds), whether it has samples enough
to be ranked, and why its rounds or replicates disagree."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from runner.measure.machine_load import was_busy
from runner.measure.samples import turn_typical, typical_s
from runner.report.ratio import UNSTABLE_SPREAD, Job, process_count, tamed
from runner.report.rounds_order import instability

# fewer samples than this rank nothing: a generation timed once at a real model's size (its warm-up cut short by the
# budget) gave 0.36x a token [0.01-21.5] beside 1.64 s a generation against 172 ms
MIN_RANK_SAMPLES = 3
PART_BLOCK = 3  # consecutive parts of a call taken as one block, its fastest part standing for it (as a turn's fastest
# block does): a part that lost its core then moves no block (simulated, 1 part in 15 stalled 2-3x: identical jobs
# called different 5.7% of the time at 95%, against 7.9% part by part; tests/test_comparison.py)


@dataclass(frozen=True)
class Timings:
    """One side of a comparison: a run, or a configuration's replicates pooled. `replicates` holds each one's
    samples (seconds per call, with the round and worker process of each); it is empty where the samples are not
    on this machine, and the median of the replicates' medians then stands in for the typical time."""

    replicates: tuple[Job, ...] = ()
    medians_s: tuple[float, ...] = ()  # each replicate's median (time_median_s)
    busy: float = 0.0  # other runnable threads while it was timed, on average (machine_other_runnable)
    hosts: tuple[str, ...] = ()  # where each replicate ran ('' unknown): a node measures a block of its own rounds
    # each replicate's repeated parts of a call, a row per sample (Task.repeated_parts: a generation's decode steps);
    # empty where the task times none
    parts: tuple[np.ndarray, ...] = ()
    # the rounds each replicate was timed in (runner.record.runs.Run.timed_in): paired only where two share one;
    # empty where not known (then only the hosts tell)
    timed_in: tuple[str, ...] = ()

    def by_host(self) -> dict[str, list[Job]]:
        """Its replicates per host that ran them (none where the hosts are not known)."""
        found: dict[str, list[Job]] = {}
        if len(self.hosts) == len(self.replicates):
            for host, job in zip(self.hosts, self.replicates, strict=True):
                if host:
                    found.setdefault(host, []).append(job)
        return found

    def typical_s(self) -> float:
        """The geometric mean of the replicates' typical times (one replicate: its own)."""
        if not self.replicates:
            return float(np.median(self.medians_s)) if self.medians_s else math.nan
        return float(np.exp(np.mean(np.log([typical_s(job.seconds, job.rounds) for job in self.replicates]))))

    def rounds(self, tame: bool = True) -> tuple[np.ndarray, np.ndarray]:
        """The typical time per round (each turn's fastest block), the geometric mean over the replicates, with
        the round numbers. Each replicate's stalled turns are pulled in first (ratio.tamed): replicates that stall
        in different rounds would otherwise lift most rounds' mean."""
        pull = tamed if tame else (lambda logs: logs)
        turns = [turn_typical(job.seconds, job.rounds) for job in self.replicates]
        logs_of = [dict(zip(sorted(t), pull(np.log([t[n] for n in sorted(t)])), strict=True)) for t in turns]
        numbers = sorted(set().union(*turns))
        return np.exp([np.mean([t[n] for t in logs_of if n in t]) for n in numbers]), np.array(numbers)

    def part_rounds(self) -> tuple[np.ndarray, np.ndarray] | None:
        """Each repeated part of each sample as a round of its own (`rounds`' shape): round r's part j is numbered
        r * (parts + 1) + j, so that two runs doing the same work pair their parts by round and position. None where
        a replicate has no parts."""
        if not self.parts or len(self.parts) != len(self.replicates):
            return None
        jobs = []
        for job, parts in zip(self.replicates, self.parts, strict=True):
            rows, width = np.atleast_2d(np.asarray(parts, dtype=float)), np.shape(parts)[-1]
            rounds = np.ones(len(rows), dtype=int) if job.rounds is None else np.asarray(job.rounds, dtype=int)
            if len(rows) != len(rounds) or not np.isfinite(rows).all():
                return None  # parts not observed (a workload's own generate(), its tokens at the end)
            keys = rounds[:, None] * (width + 1) + np.arange(width)[None, :] // PART_BLOCK
            jobs.append(Job(rows.ravel(), keys.ravel()))
        return Timings(tuple(jobs)).rounds()

    def samples(self) -> int:
        """Its timed samples (calls or blocks of calls), all replicates together; where it timed a call's parts (a
        generation's decode steps), the parts observed, which compare where whole calls are too few."""
        observed = sum(int(np.isfinite(np.asarray(p, dtype=float)).sum()) for p in self.parts)
        return observed or self.calls()

    def calls(self) -> int:
        """Its timed samples of whole calls (or blocks of calls), all replicates together."""
        return sum(len(job.seconds) for job in self.replicates)

    def too_few(self) -> str | None:
        """Why it has too few samples to be ranked (MIN_RANK_SAMPLES), or None (also where only medians are here).
        A call's parts count as samples on a quiet machine only: they all share the call's one turn, and on a busy
        machine what ran in another job's turn is beyond them (_unless_busy), so whole calls must be enough."""
        if not self.replicates or (self.samples() >= MIN_RANK_SAMPLES and self.calls() >= MIN_RANK_SAMPLES):
            return None
        if self.samples() < MIN_RANK_SAMPLES:
            return f"not enough samples ({self.samples()})"
        if was_busy(self.busy):
            calls, busy = f"{self.calls()} call{'s' if self.calls() > 1 else ''}", f"{self.busy:.1f} other runnable"
            return f"not enough samples ({calls}; on a busy machine a call's parts do not count: {busy})"
        return None

    def ranked(self) -> bool:
        """Whether it has samples enough to be ranked (too_few)."""
        return self.too_few() is None

    def processes(self) -> int:
        """The worker processes its samples came from, all replicates together."""
        return sum(process_count(job) for job in self.replicates)

    def instability(self) -> str | None:
        """Why it gets no verdict: its replicates' typical times spread more than UNSTABLE_SPREAD, or its rounds
        do (rounds_order.instability); None when they agree."""
        each = [typical_s(job.seconds, job.rounds) for job in self.replicates] or list(self.medians_s)
        if len(each) > 1 and max(each) / min(each) > UNSTABLE_SPREAD:
            return f"its replicates' typical times spread {max(each) / min(each):.0f}x"
        return instability(*self.rounds(tame=False)) if self.replicates else None

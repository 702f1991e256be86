"""A cluster sweep blocked by node: every node measures every configuration in its own interleaved rounds, and the
answer pools the nodes as replicates (runner.report.ratio.node_spread). Simulated sweeps with a known ratio check
that nodes of different speeds are ranked together, that more nodes narrow the interval, and that the interval holds
the truth as often as it says."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from helpers import identified

from runner.report import pooled, sweep_answer
from runner.report.ratio import NODE_SD, PROCESS_SD, Job, node_spread

ROUNDS, PER_ROUND = 20, 5


def node_sweep(rng: np.random.Generator, nodes: int, ratio: float, node_sd: float = 0.005) -> pd.DataFrame:
    """numpy and torch (torch `ratio` times slower) on each of `nodes` nodes: each node has its own speed (up to 10%
    apart), its rounds their shared phase, each job its process's offset, and torch's ratio moves from node to node
    by `node_sd` (node x configuration)."""
    rows = []
    for node in range(nodes):
        speed, phase = rng.normal(0, 0.05), np.repeat(rng.normal(0, 0.05, ROUNDS), PER_ROUND)
        interaction = rng.normal(0, node_sd)
        for backend, factor in (("numpy", 1.0), ("torch", ratio * math.exp(interaction))):
            noise = rng.normal(0, 0.02, ROUNDS * PER_ROUND) + rng.normal(0, PROCESS_SD)
            samples = 1e-4 * factor * np.exp(speed + phase + noise)
            rows.append(
                {
                    "run": f"{backend} @ node-{node}",
                    "status": "FINISHED",
                    "host": f"node-{node}",
                    "params.model.name": "mlp",
                    "params.task.name": "gradients",
                    "params.backend.name": backend,
                    "metrics.time_median_s": float(np.median(samples)),
                    "samples_s": samples,
                    "sample_rounds": np.repeat(np.arange(1, ROUNDS + 1), PER_ROUND),
                    "size": np.nan,
                    "size_name": None,
                }
            )
    return identified(pd.DataFrame(rows))


def torch_against_numpy(frame: pd.DataFrame) -> pooled.Pooled:
    (found,) = [p for p in pooled.pool(frame) if p.label == "torch"]
    return found


def test_nodes_of_one_kind_are_ranked_together_as_replicates():
    answer = pooled.pool(node_sweep(np.random.default_rng(0), 3, 1.2))
    (found,) = [p for p in answer if p.label == "torch"]
    assert found.runs == 3 and found.comparison.basis == "20 rounds on 3 nodes"
    assert found.low < 1.2 < found.high and str(found.verdict) == "slower"
    headers, cells = sweep_answer.table_cells(answer)
    assert [row[headers.index("runs")] for row in cells] == ["3 on 3 nodes"] * 2
    assert [row[headers.index("ratio from")] for row in cells] == ["", "20 rounds on 3 nodes"]  # the fastest: none
    headers, _ = sweep_answer.table_cells(pooled.pool(node_sweep(np.random.default_rng(0), 1, 1.2)))
    assert "ratio from" not in headers  # one node: the per-job table says it


def test_more_nodes_give_a_narrower_interval():
    """Each node's own speed (5% sd) cancels in its ratio: the width shrinks with the nodes, as replicates do."""
    widths = {n: [] for n in (1, 3, 6)}
    for seed in range(20):
        for nodes in widths:
            found = torch_against_numpy(node_sweep(np.random.default_rng(seed), nodes, 1.2))
            widths[nodes].append(math.log(found.high / found.low))
    one, three, six = (float(np.median(widths[n])) for n in (1, 3, 6))
    assert six < three < one, (one, three, six)


def test_the_pooled_interval_holds_the_truth_as_often_as_it_says():
    """200 simulated 3-node sweeps with a node-to-node spread of the ratio twice the stated NODE_SD: the 95% interval
    holds the true ratio in at least 93% of them (a binomial sd is 1.5% at 200)."""
    rng = np.random.default_rng(11)
    held = 0
    for _ in range(200):
        found = torch_against_numpy(node_sweep(rng, 3, 1.1, node_sd=2 * NODE_SD))
        held += found.low <= 1.1 <= found.high
    assert held / 200 >= 0.93, held


def test_the_node_spread_is_measured_from_the_nodes_and_falls_back_to_the_stated_default():
    rng = np.random.default_rng(5)
    rounds = np.repeat(np.arange(1, 41), 3)

    def job(offset: float) -> Job:
        return Job(1e-4 * np.exp(offset + rng.normal(0, 0.01, rounds.size)), rounds)

    same = node_spread({"a": [job(0.0)], "b": [job(0.0)]}, {"a": [job(0.0)], "b": [job(0.0)]})
    assert same is not None and same.nodes == 2 and same.sd < NODE_SD  # nothing between nodes: under the prior
    apart = {f"n{i}": [job(0.1 * i)] for i in range(6)}  # each node's ratio 10% from the next
    wide = node_spread(apart, {f"n{i}": [job(0.0)] for i in range(6)})
    assert wide is not None and wide.measured > 0.1 and wide.sd > 5 * NODE_SD
    assert node_spread({"a": [job(0.0)]}, {"a": [job(0.0)]}) is None  # one node: no node term


def test_jobs_each_alone_on_a_node_of_their_own_compare_as_measured_apart():
    """A sweep with a node per job: identical work on two nodes 6% apart in speed is not called different, since
    their rounds met two machines, not the same moments of one (unpaired, the drift between them added)."""
    rng = np.random.default_rng(3)
    frame = node_sweep(rng, 1, 1.0, node_sd=0.0)
    rounds = np.repeat(np.arange(1, ROUNDS + 1), PER_ROUND)
    for row, (host, speed) in enumerate((("node-0", 1.0), ("node-1", 1.06))):  # node-1 runs all work 6% slower
        frame.at[row, "host"] = host
        frame.at[row, "samples_s"] = 1e-4 * speed * np.exp(rng.normal(0, 0.01, rounds.size))
    found = torch_against_numpy(frame)
    assert found.ratio == pytest.approx(1.06, rel=0.01)
    assert found.comparison.basis is not None and "unpaired" in found.comparison.basis
    assert str(found.verdict) == "within noise", found.comparison

#!/usr/bin/env python
"""Generation sweeps as two markdown tables (for BENCHMARKS.md): how every run agrees with the float64 reference and
with the others, and its time to first token, time per token and tokens per second.

    .venv/bin/python run.py +experiment=generation                # the tiny model
    .venv/bin/python run.py +experiment=generation model=gpt2_small task.new_tokens=32
    .venv/bin/python benchmarks/generation_table.py SWEEP_DIR [SWEEP_DIR ...]

Tokens "same as" compares each run's tokens (tensors.h5 outputs/tokens) with those of the first run of the same model,
dtype and batch, up to the first step either run left undecided (first_undecided_token): after it, a backend may fairly
choose another token.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import h5py
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from runner.record.table import format_seconds  # noqa: E402

KERAS = "keras_hub"


def runs(sweep: Path) -> list[dict]:
    found = []
    for result in sorted(sweep.glob("*/result.json"), key=lambda p: int(p.parent.name)):
        record = json.loads(result.read_text())
        if record.get("status") != "FINISHED":
            continue
        with h5py.File(result.parent / "tensors.h5") as f:
            tokens = f["outputs/tokens"][()]
        config, m = record["config"], record["metrics"]
        implementation = KERAS if "keras_hub" in config["model"]["_target_"] else "runner"
        model = config["model"]
        work = f"{model['name']} {model['layers']}x{model['d_model']} {config['dtype']}, batch {config['batch_size']}"
        name = f"{work}: {config['backend']['name']} {config['mode']['name']} ({implementation})"
        found.append({"name": name, "work": work, "dtype": config["dtype"], "metrics": m, "tokens": tokens})
    return found


def same_tokens(run: dict, found: list[dict]) -> str:
    """'yes' where the tokens match those of the first run of the same model, dtype and batch, up to the first step
    either left undecided."""
    first = next(r for r in found if r["work"] == run["work"])
    limits = [int(r["metrics"]["first_undecided_token"]) for r in (run, first)]
    upto = min((n for n in limits if n >= 0), default=run["tokens"].shape[1])
    same = np.array_equal(run["tokens"][:, :upto], first["tokens"][:, :upto])
    return ("yes" if same else "NO") + (f" (first {upto} steps decided)" if upto < run["tokens"].shape[1] else "")


def agreement(found: list[dict]) -> list[str]:
    head = "| run | dtype | max rel err | decided | tokens differ | cache vs recompute | same tokens as the first |"
    lines = [head, "|---|---|---|---|---|---|---|"]
    for r in found:
        m = r["metrics"]
        cache = m.get("cache_vs_recompute_max_rel_err")
        lines.append(
            f"| {r['name']} | {r['dtype']} | {m['max_rel_err_vs_reference']:.2g} | {int(m['tokens_decided'])} of "
            f"{r['tokens'].size} | {int(m['tokens_differ'])} | {'' if cache is None else f'{cache:.2g}'} | "
            f"{same_tokens(r, found)} |"
        )
    return lines


def speed(found: list[dict]) -> list[str]:
    lines = [
        "| run | generation | first token | per token p50 | p99 | tokens/s | decode GB/s | of the machine's "
        "| first call |",
        "|---|---|---|---|---|---|---|---|---|",
    ]

    def cell(m: dict, key: str) -> str:
        return format_seconds(m[key]) if key in m else "n/a"

    for r in sorted(found, key=lambda r: r["metrics"]["time_typical_s"]):
        m = r["metrics"]
        lines.append(
            f"| {r['name']} | {format_seconds(m['time_typical_s'])} | {cell(m, 'ttft_s')} | {cell(m, 'tpot_p50_s')} | "
            f"{cell(m, 'tpot_p99_s')} | {m['tokens_per_s']:.3g} | {number(m, 'decode_bandwidth_GBps', '.3g')} | "
            f"{number(m, 'decode_bandwidth_share', '.1%')} | {format_seconds(m['first_call_s'])} |"
        )
    return lines


def number(m: dict, key: str, spec: str) -> str:
    """A metric as `spec` writes it, 'n/a' where the run has none (keras_hub's tokens come at the end)."""
    return format(m[key], spec) if key in m else "n/a"


if __name__ == "__main__":
    for sweep in map(Path, sys.argv[1:]):
        found = runs(sweep)
        print(f"\n{sweep}\n")
        print("\n".join(agreement(found)) + "\n")
        print("\n".join(speed(found)))

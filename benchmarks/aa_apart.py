#!/usr/bin/env python
"""The A/A test of `runner compare`: the same sweep of identical jobs twice, one after the other, compared
as before/after. Nothing changed between the two, so the 95% intervals should exclude 1 for about 1 pair
in 20 (shared among the pairs of a comparison: fewer), and no pair should be called slower or faster.

    .venv/bin/python benchmarks/aa_apart.py                # numpy, torch, tensorflow; ~8 min
    .venv/bin/python benchmarks/aa_apart.py --write        # and rewrite its section of BENCHMARKS.md
    .venv/bin/python benchmarks/aa_apart.py --backends torch --jobs 4 --repeats 3

Prints one row per comparison and the sd of the log ratios, the spread between two sweeps of one job; each
comparison's mean log ratio is the drift of the machine between its two sweeps (runner.report.ratio.APART_SD).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "src"), str(ROOT / "benchmarks")]
BEGIN, END = "<!-- aa-apart:begin -->", "<!-- aa-apart:end -->"
from parity import replace_section  # noqa: E402

from runner import report  # noqa: E402
from runner.record import runs  # noqa: E402
from runner.report import before_after  # noqa: E402


def sweep(out: Path, backend: str, jobs: int, budget: float) -> pd.DataFrame:
    command = [str(ROOT / ".venv/bin/python"), str(ROOT / "run.py"), "-m", "model=mlp", "task=gradients"]
    command += [f"backend={backend}", f"seed=range(0,{jobs})", f"timing.max_time_s={budget}", "tracking=none"]
    subprocess.run([*command, f"hydra.sweep.dir={out}"], cwd=ROOT, capture_output=True, check=False)
    return report.frame(runs.from_dirs(runs.runs_in(out)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backends", default="numpy,torch,tensorflow")
    parser.add_argument("--jobs", type=int, default=8)
    parser.add_argument("--budget", type=float, default=0.5)
    parser.add_argument("--repeats", type=int, default=2, help="before/after pairs of sweeps per backend")
    parser.add_argument("--write", action="store_true", help="rewrite the section of BENCHMARKS.md")
    args = parser.parse_args()
    rows, logs = [], []
    with tempfile.TemporaryDirectory(prefix="aa-apart-") as tmp:
        for backend in args.backends.split(","):
            for repeat in range(args.repeats):
                before = sweep(Path(tmp) / f"{backend}-{repeat}-a", backend, args.jobs, args.budget)
                after = sweep(Path(tmp) / f"{backend}-{repeat}-b", backend, args.jobs, args.budget)
                compared = before_after.compare(before, after)
                excluded = ((compared["low"] > 1) | (compared["high"] < 1)).sum()
                called = compared["verdict"].isin(["slower", "faster"]).sum()
                ratios = compared["ratio"].to_numpy()
                logs += list(np.log(ratios))
                drift = float(np.exp(np.log(ratios).mean()))
                row = (backend, repeat, len(compared), int(excluded), int(called), ratios.min(), ratios.max(), drift)
                rows.append(row)
                line = (
                    "{} #{}: {} pairs, interval excludes 1: {}, called changed: {}, ratios {:.3f}-{:.3f}, drift {:.3f}"
                )
                print(line.format(*row), flush=True)
    pairs = sum(r[2] for r in rows)
    drift_sd = np.std(np.log([r[7] for r in rows]), ddof=1)
    summary = (
        f"in all: {pairs} pairs, interval excludes 1 for {sum(r[3] for r in rows)}, "
        f"called slower or faster {sum(r[4] for r in rows)}; sd of log(after/before) {np.std(logs, ddof=1):.4f}, "
        f"of the drifts {drift_sd:.4f}"
    )
    print(summary)
    if args.write:
        path = ROOT / "BENCHMARKS.md"
        path.write_text(replace_section(path.read_text(), section(rows, summary, args), BEGIN, END))


def section(rows: list[tuple], summary: str, args: argparse.Namespace) -> str:
    lines = [
        BEGIN,
        "## A/A apart: `runner compare` of two identical sweeps",
        "",
        f"`benchmarks/aa_apart.py`: the MLP gradients sweep of {args.jobs} identical jobs "
        f"(`seed=range(0,{args.jobs})`, "
        f"`timing.max_time_s={args.budget}`) run twice, one sweep after the other, and `runner compare` of the two "
        "(before/after, unpaired: runs made apart never pair their rounds, whatever their hosts are called). Its "
        "seeds are replicates of one configuration, pooled: a pair of sweeps is one comparison. Nothing changed, so "
        "no pair may be called slower or faster; *drift* is the geometric mean of a comparison's ratios, the "
        "machine's own move between its two sweeps.",
        "",
        "| backend | repeat | pairs | interval excludes 1 | called slower or faster | ratios | drift |",
        "|---|---|---|---|---|---|---|",
        *(f"| {r[0]} | {r[1]} | {r[2]} | {r[3]} | {r[4]} | {r[5]:.3f}-{r[6]:.3f} | {r[7]:.3f} |" for r in rows),
        "",
        summary + ".",
        END,
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    main()

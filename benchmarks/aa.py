#!/usr/bin/env python
"""The A/A test: sweeps of identical jobs (the seed changes the weights, not the cost). A comparison that
works calls about 1 job in 20 different at 95%, puts the medians within a few percent, and prints no
ratio that its medians contradict.

    .venv/bin/python benchmarks/aa.py                                   # every backend, 8 and 16 jobs, ~15 min
    .venv/bin/python benchmarks/aa.py --backends torch --jobs 8 --budgets 0.5
    .venv/bin/python benchmarks/aa.py --checkout ../before              # the same sweeps with another checkout's run.py
    .venv/bin/python benchmarks/aa.py --busy 3                          # the README's 4-backend sweep, 3 times,
                                                                        # two processes burning both cores half the time

Prints one row per sweep; with --write, rewrites the A/A section of BENCHMARKS.md (between the markers).
"""

from __future__ import annotations

import argparse
import datetime
import multiprocessing
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from parity import replace_section  # noqa: E402
from rounds import burn  # noqa: E402

BEGIN, END = "<!-- aa:begin -->", "<!-- aa:end -->"
AGREES = 1.25  # a ratio further than this from its medians' ratio contradicts them


def sweep(checkout: Path, out: Path, *overrides: str) -> pd.DataFrame:
    """Run one sweep of the MLP, untracked; its report/runs.csv."""
    command = [str(ROOT / ".venv/bin/python"), str(checkout / "run.py"), "-m", "model=mlp", "tracking=none"]
    command += [*overrides, f"hydra.sweep.dir={out}"]
    subprocess.run(command, cwd=checkout, capture_output=True, text=True, check=False)
    return pd.read_csv(out / "report" / "runs.csv")


def aa_sweep(checkout: Path, backend: str, task: str, jobs: int, budget: float, out: Path) -> pd.DataFrame:
    """`jobs` identical jobs: the seed changes the weights, not the cost."""
    return sweep(
        checkout, out, f"backend={backend}", f"task={task}", f"seed=range(0,{jobs})", f"timing.max_time_s={budget}"
    )


def busy_sweeps(checkout: Path, repeats: int, out: Path) -> pd.DataFrame:
    """The README's four-backend sweep while two processes each burn a core half the time."""
    context = multiprocessing.get_context("spawn")
    stop = context.Event()
    burners = [context.Process(target=burn, args=(stop,), daemon=True) for _ in range(2)]
    for burner in burners:
        burner.start()
    try:
        frames = []
        for repeat in range(repeats):
            runs = sweep(checkout, out / str(repeat), "backend=numpy,torch,tensorflow,tnp")
            frames.append(runs.assign(repeat=repeat))
    finally:
        stop.set()
        for burner in burners:
            burner.join()
    return pd.concat(frames)


def verdicts(runs: pd.DataFrame) -> dict:
    """What the sweep said about its identical jobs."""
    finished = runs[runs["status"] == "FINISHED"]
    medians = finished["time_median_s"]
    fastest = medians.min()
    by_medians = finished["time_ratio"] / (medians / fastest)
    verdict = finished["within_noise"].astype(str)
    compared = finished[verdict != "fastest"]
    return {
        "jobs": len(runs),
        "finished": len(finished),
        "max/min": medians.max() / fastest,
        "called different": int((compared["within_noise"] == "no").sum()),
        "compared": len(compared),
        "unstable": int(verdict.str.startswith("unstable").sum()),
        "contradicted": int(((by_medians > AGREES) | (by_medians < 1 / AGREES)).sum()),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backends", default="numpy,torch,tensorflow,tnp")
    parser.add_argument("--tasks", default="gradients")
    parser.add_argument("--jobs", default="8,16")
    parser.add_argument("--budgets", default="0.5,1")
    parser.add_argument("--checkout", type=Path, default=ROOT, help="run this checkout's run.py (default: this one)")
    parser.add_argument("--label", default="", help="a name for this checkout in the table")
    parser.add_argument("--csv", type=Path, help="append the rows to this CSV")
    parser.add_argument("--write", action="store_true", help="rewrite the A/A section of BENCHMARKS.md")
    parser.add_argument("--busy", type=int, default=0, help="only the four-backend sweep, this many times, busy")
    args = parser.parse_args()
    if args.busy:
        with tempfile.TemporaryDirectory() as tmp:
            runs = busy_sweeps(args.checkout.resolve(), args.busy, Path(tmp))
        print(busy_table(runs.assign(code=args.label)))
        return
    rows = []
    started = time.time()
    with tempfile.TemporaryDirectory() as tmp:
        for backend in args.backends.split(","):
            for task in args.tasks.split(","):
                for budget in map(float, args.budgets.split(",")):
                    for jobs in map(int, args.jobs.split(",")):
                        out = Path(tmp) / f"{backend}-{task}-{budget}-{jobs}"
                        t0 = time.perf_counter()
                        row = verdicts(aa_sweep(args.checkout.resolve(), backend, task, jobs, budget, out))
                        row = {"code": args.label, "backend": backend, "task": task, "budget_s": budget, **row}
                        row["wall_s"] = time.perf_counter() - t0
                        rows.append(row)
                        print(", ".join(f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()))
    frame = pd.DataFrame(rows)
    if args.csv:
        frame.to_csv(args.csv, mode="a", header=not args.csv.exists(), index=False)
    if args.write:
        frame = pd.read_csv(args.csv) if args.csv else frame
        path = ROOT / "BENCHMARKS.md"
        path.write_text(replace_section(path.read_text(), section(frame, started), BEGIN, END))


def busy_table(runs: pd.DataFrame) -> str:
    """One line per job of the busy sweeps: its median, its ratio and what its medians say, the verdict."""
    lines = [
        "| code | repeat | backend | median | time / fastest | by the medians | within noise |",
        "|---|---|---|---|---|---|---|",
    ]
    for _, group in runs.groupby(["code", "repeat"]):
        fastest = group["time_median_s"].min()
        for _, r in group.iterrows():
            lines.append(
                f"| {r['code']} | {r['repeat']} | {r['backend']} | {r['time_median_s'] * 1e6:.0f} µs "
                f"| {r['time_ratio']:.2f}x | {r['time_median_s'] / fastest:.2f}x | {r['within_noise']} |"
            )
    return "\n".join(lines)


def section(frame: pd.DataFrame, started: float) -> str:
    """The markdown table of the A/A section."""
    when = datetime.datetime.fromtimestamp(started, datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    lines = [
        BEGIN,
        f"Run {when} on {os.cpu_count()} cores (`.venv/bin/python benchmarks/aa.py`): MLP, float32, "
        "`seed=range(0,N)`, tracking off. *called different*: jobs whose 95% interval against the fastest "
        f"excludes 1; *contradicted*: ratios more than {AGREES}x from the ratio of their medians.",
        "",
        "| code | backend | task | max_time_s | jobs | medians max/min | called different | unstable "
        "| contradicted | wall s |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for _, r in frame.iterrows():
        called = f"{r['called different']} of {r['compared']}"
        lines.append(
            f"| {r['code']} | {r['backend']} | {r['task']} | {r['budget_s']:g} | {r['jobs']} | {r['max/min']:.3f} "
            f"| {called} | {r['unstable']} | {r['contradicted']} | {r['wall_s']:.0f} |"
        )
    total_compared = frame["compared"].sum()
    rate = frame["called different"].sum() / total_compared if total_compared else np.nan
    lines += ["", f"Called different over all rows of this table: {rate:.1%}.", END]
    return "\n".join(lines)


if __name__ == "__main__":
    main()

#!/usr/bin/env python
"""Issue 81's history, real: sweeps of two seeds of one case, one after the other into a fresh store, the workload
10% heavier from a known sweep on, then `runner history --json` over the store. Is the step found at its sweep, and
do identical sweeps give none?

    .venv/bin/python benchmarks/history_sweeps.py --stepped 2 --identical 2          # about 4 minutes a trial here
    .venv/bin/python benchmarks/history_sweeps.py --stepped 10 --identical 20 --write  # the issue's count

Each sweep is one `run.py -m` process of model=chain (tests/plugin/chain_model.py) on numpy, task=inference,
threads=1, seed=0,1 (two replicates of one configuration, measured together: one point of the series), each job
`timing.max_time_s=BUDGET`. In a *stepped* trial, from sweep STEP_AT on (0-based) RUNNER_TEST_EXTRA_WORK=EXTRA gives
the chain that share more layers, its case unchanged; an *identical* trial changes nothing. Every second trial of each
kind runs a load that comes and goes: history_real's half-core burner beside the sweeps --load names. A stepped trial
finds its step where `runner history` reports one significant step, at the first run of sweep STEP_AT, and no other:
a regression, or 'busy machine' where its runs were timed beside other work (the busy rule, which fails no gate on
it); an identical trial passes where it reports no step.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "src"), str(ROOT / "benchmarks")]
BEGIN, END = "<!-- history-sweeps:begin -->", "<!-- history-sweeps:end -->"
from history_real import BURNER  # noqa: E402
from parity import replace_section  # noqa: E402

from runner.record.table import markdown  # noqa: E402

PYTHON = sys.executable
PLUGIN = ROOT / "tests" / "plugin"
SEEDS = "0,1"
HEADER = ("trial", "load", "steps `runner history` reported (sweep, 0-based: label ratio, p)", "as it should")
# A step found at its sweep, as a regression, or as 'busy machine' where its runs were timed beside other work
# (runner.history.build.unless_busy: shown, no gate fails on it).
FOUND = ("regression", "busy machine")


def sweep(uri: str, out: Path, budget: float, extra: float, loaded: bool) -> None:
    """One sweep of the two seeds, a burner beside it where `loaded`."""
    command = [
        PYTHON, str(ROOT / "run.py"), "-m", f"hydra.searchpath=[file://{PLUGIN / 'conf'}]", "model=chain",
        "task=inference", "backend=numpy", "threads=1", f"seed={SEEDS}", f"timing.max_time_s={budget:g}",
        f"tracking.uri={uri}", "tracking.experiment=history-sweeps", f"hydra.sweep.dir={out}",
    ]  # fmt: skip
    path = os.pathsep.join([str(PLUGIN), str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])
    env = {**os.environ, "PYTHONPATH": path, "RUNNER_TEST_EXTRA_WORK": f"{extra:g}"}
    burner = subprocess.Popen([PYTHON, "-c", BURNER, "600"]) if loaded else None
    try:
        done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    finally:
        if burner is not None:
            burner.kill()
            burner.wait()
    if done.returncode != 0:
        raise SystemExit(f"sweep {out.name} exited {done.returncode}:\n{done.stderr[-3000:]}")


def trial(folder: Path, args: argparse.Namespace, stepped: bool, loaded: bool) -> list[dict]:
    """The sweeps of one trial into folder/mlflow.db, then the steps `runner history --json` reports (one case)."""
    uri = f"sqlite:///{folder / 'mlflow.db'}"
    load = {int(i) for i in args.load.split(",") if i} if loaded else set()
    for i in range(args.sweeps):
        extra = args.extra if stepped and i >= args.step_at else 0.0
        sweep(uri, folder / f"sweep-{i:02d}", args.budget, extra, i in load)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run(
        [PYTHON, "-m", "runner", "history", "--tracking-uri", uri, "--json"], env=env, capture_output=True, text=True
    )
    if done.returncode != 0:
        raise SystemExit(f"runner history exited {done.returncode}:\n{done.stderr[-3000:]}")
    (case,) = json.loads(done.stdout)
    return case["steps"]


def verdict(steps: list[dict], stepped: bool, args: argparse.Namespace) -> tuple[str, bool]:
    """The steps as a cell (sweep: label ratio, p) and whether the trial came out as it should."""
    seeds = len(SEEDS.split(","))
    said = "; ".join(
        f"{s['index'] // seeds}: {s['label']}{'' if s['significant'] else ' (not significant)'} "
        f"{s['ratio']:.3f}, p {s['p_value']:.2g}"
        for s in steps
    )
    if not stepped:
        return said or "none", not steps
    found = [(s["index"], s["significant"]) for s in steps] == [(args.step_at * seeds, True)]
    return said or "none", found and steps[0]["label"] in FOUND


def section(rows: list[list[str]], args: argparse.Namespace) -> str:
    stepped = [r for r in rows if r[0].startswith("stepped")]
    identical = [r for r in rows if r[0].startswith("identical")]
    lines = [
        BEGIN,
        "## History: real sweeps of two seeds (issue 81)",
        "",
        f"Regenerate: `.venv/bin/python benchmarks/history_sweeps.py --stepped {args.stepped} --identical "
        f"{args.identical} --write` (this 2-core VM, shared with other work). Each trial: {args.sweeps} sweeps, one "
        f"after the other into a fresh store, each a `run.py -m` of model=chain on numpy, seed={SEEDS}, threads=1, "
        f"timing.max_time_s={args.budget:g}; *stepped*: {args.extra:.0%} more layers from sweep {args.step_at + 1} "
        f"on; *load*: half a core burnt in bursts beside sweeps {args.load} (0-based). Then `runner history --json`; "
        "*as it should*: one significant step at the first run of the stepped sweep and nothing else (a regression, "
        "or *busy machine* where its runs were timed beside other work: the busy rule, no gate fails on it), or no "
        f"step at all. Stepped: {sum(r[3] == 'yes' for r in stepped)} of {len(stepped)} as they should; identical: "
        f"{sum(r[3] == 'yes' for r in identical)} of {len(identical)}.",
        "",
        markdown(HEADER, rows).rstrip("\n"),
    ]
    return "\n".join([*lines, END])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stepped", type=int, default=2, help="trials with the step")
    parser.add_argument("--identical", type=int, default=2, help="trials of identical sweeps")
    parser.add_argument("--sweeps", type=int, default=12)
    parser.add_argument("--step-at", type=int, default=6, help="the first sweep (0-based) with the extra work")
    parser.add_argument("--extra", type=float, default=0.1, help="the extra work (0.1: 10%% more layers)")
    parser.add_argument("--budget", type=float, default=1.0, help="timing.max_time_s of every job")
    parser.add_argument("--load", default="2,3,8,9", help="sweeps (0-based) with the burner, in loaded trials")
    parser.add_argument("--write", action="store_true", help="rewrite its section of BENCHMARKS.md")
    args = parser.parse_args()
    rows = []
    plan = [(True, i) for i in range(args.stepped)] + [(False, i) for i in range(args.identical)]
    for stepped, number in plan:
        loaded = number % 2 == 1
        with tempfile.TemporaryDirectory(prefix="history-sweeps-") as scratch:
            steps = trial(Path(scratch), args, stepped, loaded)
        said, right = verdict(steps, stepped, args)
        rows.append([f"{'stepped' if stepped else 'identical'} {number + 1}", "yes" if loaded else "", said,
                     "yes" if right else "**no**"])  # fmt: skip
        print(" | ".join(rows[-1]), flush=True)
    if args.write:
        path = ROOT / "BENCHMARKS.md"
        path.write_text(replace_section(path.read_text(), section(rows, args), BEGIN, END))
        print(f"wrote {path}")


if __name__ == "__main__":
    main()

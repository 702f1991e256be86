#!/usr/bin/env python
"""A real history: sweeps made one after the other into one MLflow store, a workload that does more work from a
known sweep on, then `runner history --json` over the store. Was the step found where it is, and nowhere else?

    .venv/bin/python benchmarks/history_real.py                    # 12 sweeps, about 5 minutes on 2 cores
    .venv/bin/python benchmarks/history_real.py --write            # and rewrite its section of BENCHMARKS.md
    .venv/bin/python benchmarks/history_real.py --burner none      # no sweep with the burner beside it

Each sweep is one `run.py -m` process (its own interpreter, as a user's sweeps are) of 4 cases: the workload
tests/plugin/chain_model.py (model=chain, a user's own workload found through hydra.searchpath and PYTHONPATH) and
the default MLP (model=mlp), both task=inference, on numpy and torch, each job `timing.max_time_s=BUDGET`, into
one sqlite store under a scratch folder. From sweep STEP_AT on (0-based), the sweeps run with
RUNNER_TEST_EXTRA_WORK=EXTRA, and model=chain runs that fraction more layers than its config says (0.1: 11 instead of
10): more work with the config, and so the case, unchanged, as a library upgrade would change it. The MLP cases do not
change: any step in them is a false alarm, as is any step in the chain cases but the one at STEP_AT.

The sweeps named by --burner (0-based) run with a half-time CPU burner beside them: a process that spins for
50 ms and sleeps for 50 ms, ending by itself after --burner-bound s, and killed when its sweep ends. Every job
runs with threads=1: on this 2-core machine, shared with other work, numpy's two BLAS threads made a 0.8 ms call
take 3-190 ms whenever another process held a core, which measures the machine, not the workload.

Prints each sweep as it ends, then per case its series (each sweep's typical time over the case's median before
the step) and the steps that `runner history` found, each with its ratio and interval; last, a diagnostic that
`runner history` does not make: each chain case over the MLP of the same sweep and backend, a series in which what
moved a whole sweep cancels, given to the same detector. `--keep DIR --again` reads a kept store's history again.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "src"), str(ROOT / "benchmarks")]
BEGIN, END = "<!-- history-real:begin -->", "<!-- history-real:end -->"
NOTES = ("<!-- history-real-notes:begin -->", "<!-- history-real-notes:end -->")  # the reading of it: kept as written
from parity import replace_section  # noqa: E402

PYTHON = sys.executable
PLUGIN = ROOT / "tests" / "plugin"
SLOWED = "chain"  # the model whose work grows from STEP_AT on
EXPERIMENT = "history-real"
BURNER = """
import sys, time
end = time.monotonic() + float(sys.argv[1])
while time.monotonic() < end:  # busy 50 ms, asleep 50 ms: half a core
    busy = time.perf_counter() + 0.05
    while time.perf_counter() < busy:
        pass
    time.sleep(0.05)
"""


def sweep_command(uri: str, out: Path, budget: float) -> list[str]:
    return [
        PYTHON,
        str(ROOT / "run.py"),
        "-m",
        f"hydra.searchpath=[file://{PLUGIN / 'conf'}]",
        f"model={SLOWED},mlp",
        "task=inference",
        "backend=numpy,torch",
        "threads=1",
        f"timing.max_time_s={budget:g}",
        f"tracking.uri={uri}",
        f"tracking.experiment={EXPERIMENT}",
        f"hydra.sweep.dir={out}",
    ]


def run_sweeps(folder: Path, args: argparse.Namespace, burner_at: set[int]) -> tuple[str, list[dict]]:
    """The sweeps, one after the other, into folder/mlflow.db: the store's URI and, per sweep, what it ran with."""
    uri = f"sqlite:///{folder / 'mlflow.db'}"
    plugin_path = os.pathsep.join([str(PLUGIN), str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])
    sweeps = []
    for i in range(args.sweeps):
        extra = args.extra if i >= args.step_at else 0.0
        env = {**os.environ, "PYTHONPATH": plugin_path, "RUNNER_TEST_EXTRA_WORK": f"{extra:g}"}
        burner = None
        if i in burner_at:
            burner = subprocess.Popen([PYTHON, "-c", BURNER, str(args.burner_bound)])
        load, began = os.getloadavg()[0], time.time()
        start = time.perf_counter()
        try:
            done = subprocess.run(
                sweep_command(uri, folder / f"sweep-{i:02d}", args.budget), cwd=ROOT, env=env, capture_output=True,
                text=True, timeout=600,
            )  # fmt: skip
        finally:
            if burner is not None:
                burner_alive = burner.poll() is None
                burner.kill()
                burner.wait()
        wall = time.perf_counter() - start
        if done.returncode != 0:
            raise SystemExit(f"sweep {i} exited {done.returncode}:\n{done.stderr[-3000:]}")
        if burner is not None and not burner_alive:
            print(f"  warning: the burner ended before sweep {i} did (--burner-bound {args.burner_bound:g} s)")
        sweeps.append(
            {"index": i, "extra": extra, "burner": burner is not None, "load": load, "wall_s": wall, "began": began,
             "ended": time.time()}
        )  # fmt: skip
        print(
            f"sweep {i:2d}: extra work {extra:g}, burner {'on ' if burner else 'off'}, load {load:.2f} before, "
            f"{wall:.0f} s",
            flush=True,
        )
    return uri, sweeps


def history_json(uri: str) -> list[dict]:
    """`runner history --tracking-uri URI --json`, run as a user runs it."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run(
        [PYTHON, "-m", "runner", "history", "--tracking-uri", uri, "--json"], env=env, capture_output=True, text=True
    )
    if done.returncode != 0:
        raise SystemExit(f"runner history exited {done.returncode}:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout)


def run_facts(uri: str) -> dict[str, dict[str, float]]:
    """Per run id, the other runnable threads its timing saw (metric machine_other_runnable), and its rounds and
    worker processes (n_rounds, n_processes)."""
    from runner.tracking.search import history_runs

    names = {"busy": "machine_other_runnable", "rounds": "n_rounds", "processes": "n_processes"}
    return {
        row["run_id"]: {key: float(row.get(f"metrics.{name}", math.nan)) for key, name in names.items()}
        for row in history_runs(uri, EXPERIMENT)
    }


def judge(histories: list[dict], sweeps: list[dict], facts: dict[str, dict], args: argparse.Namespace) -> list[dict]:
    """Per case: each run's sweep and its typical time over the case's median before the step, the steps found,
    and what they are: the step at the first run of sweep STEP_AT (found: a regression there), or false alarms."""
    cases = []
    for h in histories:
        slowed = f"-{SLOWED}-" in h["case_name"]
        runs = [(sweep_of(run["started"], sweeps), run) for run in h["runs"]]
        before = statistics.median([r["typical_s"] for i, r in runs if i < args.step_at])
        after = statistics.median([r["typical_s"] for i, r in runs if i >= args.step_at])
        found, alarms = None, []
        for step in h["steps"]:
            at = runs[step["index"]][0]
            if slowed and at == args.step_at and step["label"] == "regression":
                found = step | {"sweep": at}
            else:
                alarms.append(step | {"sweep": at})
        typical = {i: r["typical_s"] for i, r in runs}
        cases.append(
            {
                "case": h["case_name"],
                "slowed": slowed,
                "runs": len(runs),
                "typical": typical,
                "series": {i: t / before for i, t in typical.items()},
                "busy": {i: facts.get(r["run_id"], {}).get("busy", math.nan) for i, r in runs},
                "rounds": [facts.get(r["run_id"], {}).get("rounds", math.nan) for _, r in runs],
                "processes": [facts.get(r["run_id"], {}).get("processes", math.nan) for _, r in runs],
                "after_over_before": after / before,
                "found": found,
                "alarms": alarms,
                "burner_effect": _burner_effect(typical, sweeps, args.step_at),
            }
        )
        if len(runs) != len(sweeps):
            print(f"warning: {h['case_name']} has {len(runs)} runs in {len(sweeps)} sweeps")
    return sorted(cases, key=lambda c: (not c["slowed"], c["case"]))


def sweep_of(started: float, sweeps: list[dict]) -> int:
    """The sweep a run began in (its index), by the sweeps' start and end times."""
    return next((s["index"] for s in sweeps if s["began"] <= started <= s["ended"]), -1)


def _burner_effect(typical: dict[int, float], sweeps: list[dict], step_at: int) -> float:
    """The burner sweeps' typical times over the median of the quiet ones on the same side of the step (geometric
    mean; NaN without both)."""
    logs = []
    for side in (range(step_at), range(step_at, len(sweeps))):
        quiet = [typical[i] for i in side if i in typical and not sweeps[i]["burner"]]
        if quiet:
            level = statistics.median(quiet)
            logs += [math.log(typical[i] / level) for i in side if i in typical and sweeps[i]["burner"]]
    return math.exp(statistics.fmean(logs)) if logs else math.nan


def against_control(cases: list[dict], args: argparse.Namespace) -> list[str]:
    """A diagnostic, not what `runner history` does: each slowed case's typical time over the MLP's on the same
    backend in the same sweep, a series in which what moved a whole sweep cancels, given to the same detector
    (runner.history.steps, each point with the interval of runs made apart, as `runner history` gives it)."""
    from runner.history.series import apart_interval
    from runner.history.steps import Point, find_steps

    lines = [
        "| slowed case over the MLP of its sweep and backend | series (over its median before the step) | steps |",
        "|---|---|---|",
    ]
    for c in (c for c in cases if c["slowed"]):
        backend = c["case"].split("-", 1)[0]
        control = next((m for m in cases if not m["slowed"] and m["case"].startswith(f"{backend}-")), None)
        if control is None:
            continue
        sweeps = sorted(set(c["typical"]) & set(control["typical"]))
        ratios = [c["typical"][i] / control["typical"][i] for i in sweeps]
        steps = find_steps([Point(r, *apart_interval(r)) for r in ratios])
        before = statistics.median([r for i, r in zip(sweeps, ratios, strict=True) if i < args.step_at])
        found = "; ".join(
            describe({"label": str(st.label), "sweep": sweeps[st.index], "ratio": st.ratio, "low": st.low,
                      "high": st.high, "index": st.index})
            for st in steps
        )  # fmt: skip
        series = " ".join(f"{r / before:.3f}" for r in ratios)
        lines.append(f"| {c['case'].split(' batch_size')[0]} / {backend} mlp | {series} | {found or 'none'} |")
    return lines


def _span(values: list[float]) -> str:
    """'2-15', or '1' where they are all one."""
    low, high = int(min(values)), int(max(values))
    return f"{low}" if low == high else f"{low}-{high}"


def describe(step: dict) -> str:
    """'regression at sweep 6: 1.093 [1.041–1.147]'."""
    where = f"{step['label']} at sweep {step.get('sweep', step['index'])}"
    return (
        where if math.isnan(step["ratio"]) else f"{where}: {step['ratio']:.3f} [{step['low']:.3f}–{step['high']:.3f}]"
    )


def report(cases: list[dict], sweeps: list[dict], args: argparse.Namespace) -> list[str]:
    """Markdown lines: the per-sweep series of every case, and per case what was found."""
    burner = [s["index"] for s in sweeps if s["burner"]]
    head = ["sweep", "extra work", "burner", "load 1m"] + [c["case"].split(" batch_size")[0] for c in cases]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for s in sweeps:
        cells = [str(s["index"]), f"{s['extra']:g}", "on" if s["burner"] else "", f"{s['load']:.2f}"]
        cells += [
            f"{c['series'][s['index']]:.3f} ({c['busy'][s['index']]:.1f})" if s["index"] in c["series"] else ""
            for c in cases
        ]
        lines.append("| " + " | ".join(cells) + " |")
    lines += [
        "",
        "| case | runs | rounds a run (processes) | after / before (medians) | step at sweep "
        f"{args.step_at} | other steps (false alarms) | burner sweeps / quiet ones |",
        "|---|---|---|---|---|---|---|",
    ]
    for c in cases:
        if c["slowed"]:
            found = describe(c["found"]) if c["found"] else "**missed**"
        else:
            found = "(no step made)"
        alarms = "; ".join(describe(s) for s in c["alarms"]) or "none"
        effect = f"{c['burner_effect']:.3f}" if burner and not math.isnan(c["burner_effect"]) else "-"
        rounds = f"{_span(c['rounds'])} ({_span(c['processes'])})"
        lines.append(
            f"| {c['case']} | {c['runs']} | {rounds} | {c['after_over_before']:.3f} | {found} | {alarms} | {effect} |"
        )
    lines += ["", *against_control(cases, args)]
    slowed = [c for c in cases if c["slowed"]]
    found = sum(c["found"] is not None for c in slowed)
    alarms = sum(len(c["alarms"]) for c in cases)
    lines += [
        "",
        f"Step found at sweep {args.step_at} in {found} of {len(slowed)} slowed cases; false alarms: {alarms} in "
        f"{sum(c['runs'] for c in cases)} runs of {len(cases)} cases.",
    ]
    return lines


def section(lines: list[str], sweeps: list[dict], args: argparse.Namespace, total_s: float) -> str:
    from runner.record.environment import cpu_name

    burner = ",".join(str(s["index"]) for s in sweeps if s["burner"]) or "none"
    command = (
        f".venv/bin/python benchmarks/history_real.py --sweeps {args.sweeps} --step-at {args.step_at} "
        f"--extra {args.extra:g} --budget {args.budget:g} --burner {burner} --write"
    )
    return "\n".join(
        [
            BEGIN,
            "## History: a real one, with a known step",
            "",
            f"Regenerate: `{command}` ({total_s / 60:.0f} minutes; {datetime.date.today().isoformat()}, "
            f"{cpu_name()}, {os.cpu_count()} cores shared with other work, Python {platform.python_version()}). "
            f"{args.sweeps} sweeps, one after the other, each a `run.py -m` process of 4 jobs "
            f"(`model=chain,mlp task=inference backend=numpy,torch threads=1 timing.max_time_s={args.budget:g}`), "
            "into one sqlite MLflow store; then `runner history --tracking-uri URI --json` over it. `model=chain` is "
            "tests/plugin/chain_model.py, a user's own workload (hydra.searchpath, PYTHONPATH): 10 dense layers; "
            f"from sweep {args.step_at} on (0-based) RUNNER_TEST_EXTRA_WORK={args.extra:g} gives it "
            f"{args.extra:.0%} more layers, its config (and so its case) unchanged. The MLP cases do not change. "
            f"The sweeps marked *burner* ran beside a process spinning 50 ms, sleeping 50 ms. Per sweep: each case's "
            "typical time over that case's median before the step, and in brackets the other runnable threads its "
            "timing saw (metric `machine_other_runnable`); *load 1m*: the load average as the sweep began. The last "
            "table is a diagnostic, not what `runner history` does: each chain case over the MLP of the same sweep "
            "and backend, given to the same detector with the same point intervals.",
            "",
            *lines,
            END,
        ]
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sweeps", type=int, default=12)
    parser.add_argument("--step-at", type=int, default=6, help="the first sweep (0-based) with the extra work")
    parser.add_argument("--extra", type=float, default=0.1, help="the extra work, a share (0.1: 10%% more layers)")
    parser.add_argument("--budget", type=float, default=1.0, help="timing.max_time_s of every job")
    parser.add_argument("--burner", default="2,3,8,9", help="sweeps (0-based) with the burner beside them, or none")
    parser.add_argument("--burner-bound", type=float, default=300.0, help="the burner ends by itself after this")
    parser.add_argument("--keep", type=Path, help="make the store and sweeps here (kept) instead of a temporary folder")
    parser.add_argument("--again", action="store_true", help="with --keep: only read the kept store's history again")
    parser.add_argument("--write", action="store_true", help="rewrite its section of BENCHMARKS.md")
    args = parser.parse_args()
    if args.again and not args.keep:
        parser.error("--again reads a store kept by --keep")
    burner_at = set() if args.burner == "none" else {int(i) for i in args.burner.split(",") if i.strip()}
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="history-real-") as tmp:
        folder = args.keep or Path(tmp)
        folder.mkdir(parents=True, exist_ok=True)
        if args.again:
            uri, sweeps = f"sqlite:///{folder / 'mlflow.db'}", json.loads((folder / "sweeps.json").read_text())
        elif (folder / "mlflow.db").exists():
            raise SystemExit(f"{folder / 'mlflow.db'} exists: a history starts from an empty store")
        else:
            uri, sweeps = run_sweeps(folder, args, burner_at)
            (folder / "sweeps.json").write_text(json.dumps(sweeps, indent=1))
        histories = history_json(uri)
        cases = judge(histories, sweeps, run_facts(uri), args)
    lines = report(cases, sweeps, args)
    print("\n".join(lines))
    total = time.perf_counter() - start + (sum(s["wall_s"] for s in sweeps) if args.again else 0.0)
    print(f"{total:.0f} s in all")
    if args.write:
        path = ROOT / "BENCHMARKS.md"
        path.write_text(replace_section(path.read_text(), section(lines, sweeps, args, total), BEGIN, END))
        print(f"wrote {path}")


if __name__ == "__main__":
    main()

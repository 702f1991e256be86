#!/usr/bin/env python
"""`runner history` over a large MLflow store: how long one case's history takes among 10,000 runs.

    .venv/bin/python benchmarks/history_scale.py                     # 10,000 runs: creating them takes most of it
    .venv/bin/python benchmarks/history_scale.py --write             # and rewrite its section of BENCHMARKS.md
    .venv/bin/python benchmarks/history_scale.py --keep /tmp/scale   # keep the store; a second call reuses it

The store: one real run first (`run.py backend=numpy timing.max_time_s=0.1` into a store of its own), whose tags,
params and metrics are what the runner logs today; then RUNS runs made from it with MLflow's client
(create_run with the tags, log_batch with the metrics and params, set_terminated FINISHED), each with its own
`case`, `case_name`, `machine`, `machine_name` and typical time (metric `time_typical_us`, as run_page.ui_metric
logs it: microseconds), CASES cases on MACHINES machines, in time order. The runs are written into a store on
/dev/shm where there is one (the client writes about 15 runs a second there, 8 on this VM's disk), then copied
to the scratch folder, where everything is timed. The timing trace a real run also logs (a metric with one step
per sample) is left out: a search reads the runs' latest metrics, not their steps.

Timed: `runner history --tracking-uri URI --case KEY` as a fresh process (best of 3; it also tags the newest run
of each of the case's series with its verdict, as it always does), its start-up alone (`runner history --help`),
and tracking.history_runs for that case in one process (the first call, with MLflow's import and the store's
opening, then the best of 3), and history_runs over the whole store (no --case) for comparison.
"""

from __future__ import annotations

import argparse
import datetime
import math
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "src"), str(ROOT / "benchmarks")]
BEGIN, END = "<!-- history-scale:begin -->", "<!-- history-scale:end -->"
NOTES = ("<!-- history-scale-notes:begin -->", "<!-- history-scale-notes:end -->")  # the reading of it: kept as written
from parity import replace_section  # noqa: E402

PYTHON = sys.executable
EXPERIMENT = "history-scale"
START_MS = 1_780_000_000_000  # the first run's start; each next one a minute later
PER_CASE = ("case", "case_name", "machine", "machine_name", "env.hostname", "mlflow.runName", "run_dir")
LEFT_OUT = ("mlflow.parentRunId", "history.verdict", "runner.run_key")  # a sweep's, a history's: not cloned


def env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}


def template(folder: Path) -> tuple[dict[str, str], dict[str, str], dict[str, float]]:
    """The tags, params and metrics of one real run, as the runner logs them."""
    from runner.tracking.store import client

    uri = f"sqlite:///{folder / 'template.db'}"
    command = [PYTHON, str(ROOT / "run.py"), "backend=numpy", "timing.max_time_s=0.1", f"tracking.uri={uri}"]
    done = subprocess.run(
        [*command, f"hydra.run.dir={folder / 'template'}"], cwd=ROOT, env=env(), capture_output=True, text=True
    )
    if done.returncode != 0:
        raise SystemExit(f"the template run exited {done.returncode}:\n{done.stderr[-3000:]}")
    mlflow = client(uri)
    (run,) = mlflow.search_runs([e.experiment_id for e in mlflow.search_experiments()], "tags.`case` LIKE '%'")
    tags = {k: v for k, v in run.data.tags.items() if k not in LEFT_OUT}
    return tags, dict(run.data.params), dict(run.data.metrics)


def create_store(uri: str, folder: Path, args: argparse.Namespace) -> float:
    """RUNS runs at `uri` made with MLflow's client from a real run's template; returns the seconds it took."""
    from mlflow.entities import Metric, Param, RunStatus

    from runner.tracking.store import client, ensure_experiment, open_store

    tags, params, metrics = template(folder)
    start = time.perf_counter()
    open_store(uri)
    mlflow = client(uri)
    experiment = ensure_experiment(mlflow, uri, EXPERIMENT)
    rng = np.random.default_rng(args.seed)
    levels = np.exp(rng.uniform(math.log(20e-6), math.log(0.2), size=args.cases))  # each case's typical time
    machines = [(f"{m:016x}", f"host{m} · AMD EPYC 7B13 · {2 ** (m + 1)} cores") for m in range(args.machines)]
    template_us = metrics["time_typical_us"]
    for i in range(args.runs):
        c, (machine, machine_name) = i % args.cases, machines[(i // args.cases) % args.machines]
        typical_us = float(f"{levels[c] * 1e6 * math.exp(rng.normal(0, 0.03)):.4g}")
        per_run = {
            "case": f"{c:016x}",
            "case_name": f"numpy-case{c}-gradients-eager-cpu-float32 batch_size=32",
            "machine": machine,
            "machine_name": machine_name,
            "env.hostname": machine_name.split(" · ")[0],
            "mlflow.runName": f"case{c} #{i}",
            "run_dir": f"/scratch/outputs/runs/{i}",
        }
        started = START_MS + 60_000 * i
        run = mlflow.create_run(experiment, start_time=started, tags=tags | per_run)
        scaled = [
            Metric(k, float(f"{v * typical_us / template_us:.4g}") if k.endswith("_us") else v, started + 5000, 0)
            for k, v in metrics.items()
        ]
        mlflow.log_batch(run.info.run_id, metrics=scaled, params=[Param(k, v) for k, v in params.items()])
        mlflow.set_terminated(run.info.run_id, RunStatus.to_string(RunStatus.FINISHED), end_time=started + 6000)
        if (i + 1) % 1000 == 0:
            elapsed = time.perf_counter() - start
            print(f"  {i + 1} runs, {elapsed:.0f} s ({(i + 1) / elapsed:.1f} a second)", flush=True)
    return time.perf_counter() - start


def timed(command: list[str], repeats: int = 3) -> tuple[float, str]:
    """The best wall time of `command` over `repeats` fresh processes, and its last output."""
    best, out = math.inf, ""
    for _ in range(repeats):
        start = time.perf_counter()
        done = subprocess.run(command, cwd=ROOT, env=env(), capture_output=True, text=True)
        best = min(best, time.perf_counter() - start)
        if done.returncode not in (0, 1):
            raise SystemExit(f"{' '.join(command)} exited {done.returncode}:\n{done.stderr[-3000:]}")
        out = done.stdout
    return best, out


def _copy(source: Path, target: Path) -> None:
    """A consistent copy of a sqlite store (sqlite's backup: what an open connection has not yet checkpointed too)."""
    import sqlite3

    with sqlite3.connect(source) as old, sqlite3.connect(target) as new:
        old.backup(new)


def measure(uri: str, args: argparse.Namespace) -> dict:
    from runner.history import build as history
    from runner.tracking.search import history_runs

    case = f"{args.cases // 2:016x}"
    cli = [PYTHON, "-m", "runner", "history", "--tracking-uri", uri]
    results = {"case": case}
    results["cli_s"], out = timed([*cli, "--case", case])
    results["cli_lines"] = out.strip().splitlines()
    results["help_s"], _ = timed([*cli, "--help"])
    start = time.perf_counter()
    rows = history_runs(uri, None, case=case)
    results["rows_first_s"] = time.perf_counter() - start
    best = math.inf
    for _ in range(3):
        start = time.perf_counter()
        rows = history_runs(uri, None, case=case)
        best = min(best, time.perf_counter() - start)
    results["rows_s"], results["rows"] = best, len(rows)
    start = time.perf_counter()
    every = history_runs(uri, None)
    results["all_s"], results["all_rows"] = time.perf_counter() - start, len(every)
    # the store's series are noise alone (no step made): what the detector finds in them is false alarms
    histories = history.from_runs(every)
    results["series"] = len(histories)
    results["false_steps"] = sum(len(h.steps) for h in histories)
    return results


def section(results: dict, args: argparse.Namespace, created_s: float | None) -> str:
    from runner.record.environment import cpu_name

    r = results
    made = f"created in {created_s / 60:.0f} minutes" if created_s is not None else "created"
    command = (
        f".venv/bin/python benchmarks/history_scale.py --runs {args.runs} --cases {args.cases} "
        f"--machines {args.machines} --write"
    )
    return "\n".join(
        [
            BEGIN,
            "## History: one case among 10,000 runs" if args.runs == 10_000 else "## History: a large store",
            "",
            f"Regenerate: `{command}` ({datetime.date.today().isoformat()}, {cpu_name()}, {os.cpu_count()} cores "
            f"shared with other work, Python {platform.python_version()}; load average {os.getloadavg()[0]:.1f} "
            f"at the end). A sqlite MLflow store of {args.runs:,} finished runs ({made} with MLflow's client: "
            "create_run, log_batch, set_terminated), each with the tags, params and metrics of a real run "
            f"(benchmarks/history_scale.py's docstring), {args.cases} cases on {args.machines} machines, so one "
            f"case has {r['rows']} runs.",
            "",
            "| what | wall time |",
            "|---|---|",
            f"| `runner history --tracking-uri URI --case KEY`, a fresh process, best of 3 | {r['cli_s']:.2f} s |",
            f"| its start-up alone: `runner history --help`, best of 3 | {r['help_s']:.2f} s |",
            f"| `tracking.history_runs(URI, None, case=KEY)` in one process, the first call (MLflow's import, the "
            f"store opened) | {r['rows_first_s']:.2f} s |",
            f"| the same, best of 3 more calls ({r['rows']} runs) | {r['rows_s']:.3f} s |",
            f"| `tracking.history_runs(URI, None)`: every case ({r['all_rows']:,} runs) | {r['all_s']:.1f} s |",
            "",
            f"The store's {r['series']} series (a case on a machine) have no step: each run's typical time is its "
            "case's level times log-normal noise of sd 3%. The detector (runner.history.steps) found "
            f"{r['false_steps']} steps in them, {100 * r['false_steps'] / r['all_rows']:.2f} per 100 runs: false "
            "alarms.",
            "",
            "What `runner history --case` printed:",
            "",
            "```text",
            *r["cli_lines"],
            "```",
            END,
        ]
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10_000)
    parser.add_argument("--cases", type=int, default=125)
    parser.add_argument("--machines", type=int, default=4)
    parser.add_argument("--seed", type=int, default=2026)
    parser.add_argument("--keep", type=Path, help="the store's folder, kept (a store already there is reused)")
    parser.add_argument("--write", action="store_true", help="rewrite its section of BENCHMARKS.md")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="history-scale-") as tmp:
        folder = args.keep or Path(tmp)
        folder.mkdir(parents=True, exist_ok=True)
        store = folder / "mlflow.db"
        uri, created_s = f"sqlite:///{store}", None
        if not store.exists():
            fast = Path("/dev/shm")
            with tempfile.TemporaryDirectory(dir=fast if fast.is_dir() else folder) as scratch:
                made = Path(scratch) / "mlflow.db"
                created_s = create_store(f"sqlite:///{made}", folder, args)
                _copy(made, store)
            (folder / "created_s").write_text(f"{created_s:.1f}")  # for a later call that reuses the store
            print(f"{args.runs} runs created in {created_s:.0f} s", flush=True)
        elif (folder / "created_s").exists():
            created_s = float((folder / "created_s").read_text())
        results = measure(uri, args)
    for key, value in results.items():
        print(f"{key}: {value}")
    if args.write:
        path = ROOT / "BENCHMARKS.md"
        path.write_text(replace_section(path.read_text(), section(results, args, created_s), BEGIN, END))
        print(f"wrote {path}")


if __name__ == "__main__":
    main()

#!/usr/bin/env python
"""Answers on a busy machine (issue 77), measured: sweeps run while `--burners` processes spin on the 2 cores.

    .venv/bin/python benchmarks/busy_order.py ab --sweeps 10     # 5x the work in one of two environments
    .venv/bin/python benchmarks/busy_order.py aa --sweeps 20     # identical code at two versions
    .venv/bin/python benchmarks/busy_order.py train generate     # torch against jax: a train step, a generation

Each sweep is `run.py -m` at the runner's defaults (its budget, its rounds, `timing.resolve=0.1`) with tracking=none.
ab and aa time tests/plugin/plant_model.py's chain in two Python environments (plantpkg written here as wheels, as in
benchmarks/versions.py): 1.0 and 5.0 (EXTRA_WORK 4: 500 layers of 100), or 1.0 and 1.1 (identical code). A sweep
"orders" its jobs where the slower one's verdict is `slower` with the low end of its bound above 1 (an interval over
rounds or, where the rounds disagree, the sign test's). Prints one line a sweep and a summary; JSON lines to --out.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PLUGIN = ROOT / "tests" / "plugin"
sys.path[:0] = [str(ROOT / "src"), str(ROOT / "tests")]

from wheel_maker import write_wheel  # noqa: E402

PLANT = ["backend=numpy", "model=plant", "model.features=128", "task=inference", "threads=1",
         f"hydra.searchpath=[file://{PLUGIN / 'conf'}]"]  # fmt: skip
SWEEPS = {  # what -> (its overrides, plantpkg's releases and their EXTRA_WORK, or None)
    "ab": (PLANT, {"1.0": 0.0, "5.0": 4.0}),
    "aa": (PLANT, {"1.0": 0.0, "1.1": 0.0}),
    "train": (["backend=torch,jax", "model=transformer", "task=train_step"], None),
    "generate": (["backend=torch,jax", "model=gpt2", "task=generate"], None),
}


@contextlib.contextmanager
def burners(count: int) -> Iterator[None]:
    """`count` processes, each one thread that never waits: other runnable threads for the whole of the block."""
    spinning = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]
    try:
        yield
    finally:
        for process in spinning:
            process.kill()
            process.wait()


def sweep(what: str, number: int, scratch: Path) -> dict:
    overrides, releases = SWEEPS[what]
    environ = {**os.environ, "PYTHONPATH": os.pathsep.join([str(PLUGIN), str(ROOT / "src")])}
    asked = []
    if releases:
        links = scratch / f"wheels-{what}"
        for version, extra in releases.items():
            code = f"VERSION = {version!r}\nEXTRA_WORK = {extra!r}\n"
            write_wheel(links, "plantpkg", version, {"plantpkg/__init__.py": code})
        asked = [
            "environment.with=" + ",".join(f"'plantpkg=={v}'" for v in releases),
            f"environment.find_links={links}",
        ]
        environ["RUNNER_ENVIRONMENTS"] = str(scratch / "environments")
    sweep_dir = scratch / f"{what}-{number}"
    started = time.monotonic()
    command = [sys.executable, str(ROOT / "run.py"), "-m", *overrides, *asked, "tracking=none",
               f"hydra.sweep.dir={sweep_dir}"]  # fmt: skip
    done = subprocess.run(command, env=environ, capture_output=True, text=True, check=False)
    wall = time.monotonic() - started
    if done.returncode != 0:
        return {"what": what, "sweep": number, "error": done.stderr.strip().splitlines()[-1:], "wall_s": wall}
    rows = list(csv.DictReader((sweep_dir / "report" / "runs.csv").open()))
    # the job the other is timed against: the one called fastest, else (no verdict on a busy sweep) the lower ratio
    fastest = min(rows, key=lambda r: (r["verdict"] != "fastest", float(r["time_ratio"] or "inf")))
    other = next(r for r in rows if r is not fastest)
    low = float(other["time_ratio_ci_low"] or "nan")
    answer = (
        (sweep_dir / "summary.md").read_text().split("\n\n")[1].strip().strip("*")
        if (sweep_dir / "summary.md").exists()
        else ""
    )
    return {
        "what": what, "sweep": number, "fastest": fastest["run"], "slower": other["run"],
        "verdict": other["verdict"], "fastest_verdict": fastest["verdict"],
        "ratio": float(other["time_ratio"] or "nan"), "low": low,
        "high": float(other["time_ratio_ci_high"] or "nan"), "basis": other["time_ratio_basis"],
        "ordered": other["verdict"] == "slower" and low > 1, "samples": [r["n_samples"] for r in rows],
        "other_runnable": max(float(r["machine_other_runnable"] or 0) for r in rows), "wall_s": wall,
        "answer": answer,
    }  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", nargs="+", choices=list(SWEEPS))
    parser.add_argument("--sweeps", type=int, default=1)
    parser.add_argument("--burners", type=int, default=4, help="spinning processes beside the sweeps (default 4)")
    parser.add_argument("--out", type=Path, help="append the rows as JSON lines")
    args = parser.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="busy-order-"))
    with burners(args.burners):
        for what in args.what:
            found = []
            for number in range(1, args.sweeps + 1):
                row = sweep(what, number, scratch)
                found.append(row)
                print(json.dumps(row), flush=True)
                if args.out:
                    with args.out.open("a") as out:
                        out.write(json.dumps(row) + "\n")
            ordered = sum(r.get("ordered", False) for r in found)
            print(f"{what}: {ordered} of {len(found)} sweeps ordered with a bound above 1", flush=True)


if __name__ == "__main__":
    main()

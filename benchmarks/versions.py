#!/usr/bin/env python
"""Python environments as a sweep axis (docs/versions.md), measured: A/A and planted A/B sweeps of two environments,
bisections over releases with a planted step, and the cost of building and using an environment.

    .venv/bin/python benchmarks/versions.py aa --sweeps 20            # two releases of identical code
    .venv/bin/python benchmarks/versions.py ab --extra 0.03 --sweeps 20
    .venv/bin/python benchmarks/versions.py bisect --trials 10        # 10 releases, a 5% step at a varying release
    .venv/bin/python benchmarks/versions.py cost                      # first build, reuse, a run's start-up

The package that differs, plantpkg, is written here as wheels (tests/wheel_maker.py) into a scratch find-links
folder: its EXTRA_WORK gives tests/plugin/plant_model.py's chain that share more layers (0.03: 103 of 100), a known
difference in work. Each sweep is one probe of `runner bisect` (runner.launch.bisect.probe): `run.py -m` of
backend=numpy model=plant task=inference threads=1 in two environments, timed in the same interleaved rounds until
the comparison resolves 1% (timing.resolve=0.01) or the default budget ends (timing.max_time_s=5 a job). Prints one
line per sweep and a summary; JSON lines go to --out.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PLUGIN = ROOT / "tests" / "plugin"
sys.path[:0] = [str(ROOT / "src"), str(ROOT / "tests")]
os.environ["PYTHONPATH"] = os.pathsep.join([str(PLUGIN), str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])

from wheel_maker import write_wheel  # noqa: E402

from runner.launch import bisect  # noqa: E402

JOB = ["backend=numpy", "model=plant", "model.features=128", "task=inference", "threads=1", "tracking=none",
       f"hydra.searchpath=[file://{PLUGIN / 'conf'}]"]  # fmt: skip


def wheels(folder: Path, extra: dict[str, float]) -> Path:
    """plantpkg at each version of `extra`, with that EXTRA_WORK."""
    for version, share in extra.items():
        code = f"VERSION = {version!r}\nEXTRA_WORK = {share!r}\n"
        write_wheel(folder, "plantpkg", version, {"plantpkg/__init__.py": code})
    return folder


def pairs(args: argparse.Namespace, scratch: Path, extra: float) -> list[dict]:
    """args.sweeps sweeps of plantpkg 1.0 (no extra work) against 2.0 (`extra` more), each a probe."""
    links = wheels(scratch / "wheels", {"1.0": 0.0, "2.0": extra})
    sides = (bisect.Candidate("plantpkg==1.0", "1.0"), bisect.Candidate("plantpkg==2.0", "2.0"))
    found = []
    for number in range(args.sweeps):
        probe = bisect.probe("plantpkg", sides, JOB, links, 0.02, scratch / f"sweeps-{extra:g}")
        called = probe.resolved and (probe.low > 1 or probe.high < 1)
        row = {"extra": extra, "ratio": probe.ratio, "low": probe.low, "high": probe.high, "called": called}
        found.append(row)
        print(f"{number + 1:>3}: {probe.said('plantpkg')} (interval excludes 1: {called})", flush=True)
    summary(found, 1 + extra)
    return found


def summary(found: list[dict], truth: float) -> None:
    called = sum(r["called"] for r in found)
    resolved = [r for r in found if not math.isnan(r["low"])]
    held = sum(r["low"] <= truth <= r["high"] for r in resolved)
    widths = sorted((r["high"] - r["low"]) / 2 for r in resolved)
    median = widths[len(widths) // 2] if widths else math.nan
    print(f"work {truth:g}x: {called} of {len(found)} called different; {len(resolved)} with an interval, "
          f"{held} of them holding {truth:g}; median half-width ±{median:.1%}")  # fmt: skip


def bisections(args: argparse.Namespace, scratch: Path) -> list[dict]:
    """args.trials bisections over 10 releases 1.0..1.9, the step of args.extra at 1.(3 + trial % 6)."""
    found = []
    for trial in range(args.trials):
        step = 3 + trial % 6
        versions = {f"1.{i}": (args.extra if i >= step else 0.0) for i in range(10)}
        links = wheels(scratch / f"wheels-{trial}", versions)
        candidates = [bisect.Candidate(f"plantpkg=={v}", v) for v in versions]
        first, made = bisect.search("plantpkg", candidates, JOB, links, 0.02, scratch / f"bisect-{trial}")
        answer = first.after.name if first is not None and first.slower else None
        probes = len({(p.before, p.after) for p in made})
        row = {"step": f"1.{step}", "found": answer, "probes": probes, "sweeps": len(made)}
        found.append(row)
        print(
            f"trial {trial + 1}: step at 1.{step}, found {answer} in {probes} probes ({len(made)} sweeps)", flush=True
        )
    right = sum(r["found"] == r["step"] for r in found)
    print(f"bisection: the step found in {right} of {len(found)} trials; at most {max(r['probes'] for r in found)} "
          f"probes (ceil(log2 10) + 2 = 6)")  # fmt: skip
    return found


def cost(scratch: Path) -> list[dict]:
    """The first build of a one-package variant (uv's cache warm), its reuse, and a run's start-up in it against one
    in the runner's own environment (3 each, wall time of `run.py`)."""
    import subprocess

    links = wheels(scratch / "wheels", {"1.0": 0.0})
    environ = {**os.environ, "RUNNER_ENVIRONMENTS": str(scratch / "environments")}
    found = []
    for label in ("first build", "built"):
        started = time.monotonic()
        command = [sys.executable, "-c", "from runner.launch import environments as e; import sys; "
                   f"e.ready({{'with': ['plantpkg==1.0'], 'find_links': {str(links)!r}}}, say=print)"]  # fmt: skip
        subprocess.run(command, env=environ, check=True)
        found.append({"what": label, "s": time.monotonic() - started})
    for repeat in range(3):
        for label, extra in (("own", []), ("environment", ["environment.with='plantpkg==1.0'",
                                                           f"environment.find_links={links}"])):  # fmt: skip
            started = time.monotonic()
            run = [sys.executable, str(ROOT / "run.py"), "backend=numpy", "tracking=none", *extra,
                   f"hydra.run.dir={scratch / f'{label}-{repeat}'}"]  # fmt: skip
            subprocess.run(run, env=environ, check=True, capture_output=True)
            found.append({"what": f"run in {label}", "s": time.monotonic() - started})
    for row in found:
        print(f"{row['what']}: {row['s']:.1f} s")
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=("aa", "ab", "bisect", "cost"))
    parser.add_argument("--sweeps", type=int, default=20)
    parser.add_argument("--trials", type=int, default=10)
    parser.add_argument("--extra", type=float, default=0.05, help="the planted difference (ab, bisect)")
    parser.add_argument("--out", type=Path, help="append the rows as JSON lines")
    args = parser.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="versions-bench-"))
    os.environ.setdefault("RUNNER_ENVIRONMENTS", str(scratch / "environments"))
    if args.what == "aa":
        rows = pairs(args, scratch, 0.0)
    elif args.what == "ab":
        rows = pairs(args, scratch, args.extra)
    elif args.what == "bisect":
        rows = bisections(args, scratch)
    else:
        rows = cost(scratch)
    if args.out:
        with args.out.open("a") as out:
            out.writelines(json.dumps({"what": args.what, **row}) + "\n" for row in rows)


if __name__ == "__main__":
    main()

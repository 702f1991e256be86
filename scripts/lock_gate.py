"""A CI gate for a change of requirements.lock: the base's pins of what changed against the head's, as two Python
environments timed in the same interleaved rounds of one sweep (docs/versions.md).

    .venv/bin/python scripts/lock_gate.py origin/main -- backend=torch model=mlp threads=1

prints the sweep's answer and exits 1 where the head is slower by --threshold (default 0.02) or more with its interval
above 1, 3 where the comparison has no verdict (its rounds disagree: a busy runner), 0 otherwise (also where the lock
did not change), 2 on bad input.
"""

from __future__ import annotations

import argparse
import csv
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)$")


def pins(text: str) -> dict[str, str]:
    """{package: 'package==version'} of a lock's lines."""
    found = {}
    for line in text.splitlines():
        match = PIN.match(line.split(";")[0].strip())
        if match:
            found[match.group(1).lower().replace("_", "-")] = f"{match.group(1)}=={match.group(2)}"
    return found


def changed(base: dict[str, str], head: dict[str, str]) -> tuple[list[str], list[str]]:
    """The pins of each side for the packages both pin at different versions."""
    names = sorted(n for n in base.keys() & head.keys() if base[n].split("==")[1] != head[n].split("==")[1])
    return [base[n] for n in names], [head[n] for n in names]


def listed(requirements: list[str]) -> str:
    return "[" + ",".join(f"'{r}'" for r in requirements) + "]"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("base", help="the git revision to compare with (origin/main)")
    parser.add_argument("--threshold", type=float, default=0.02, help="smallest slowdown that fails (default 0.02)")
    parser.add_argument(
        "--sweep-dir", type=Path, default=ROOT / "outputs" / "lock-gate" / time.strftime("%Y%m%d-%H%M%S")
    )
    argv = sys.argv[1:]
    cut = argv.index("--") if "--" in argv else len(argv)
    args, overrides = parser.parse_args(argv[:cut]), argv[cut + 1 :]  # after --: the job, as run.py takes it
    shown = subprocess.run(["git", "-C", str(ROOT), "show", f"{args.base}:requirements.lock"], capture_output=True,
                           text=True, check=False)  # fmt: skip
    if shown.returncode != 0:
        print(f"error: {args.base}:requirements.lock: {shown.stderr.strip()}", file=sys.stderr)
        return 2
    before, after = changed(pins(shown.stdout), pins((ROOT / "requirements.lock").read_text()))
    if not before:
        print(f"requirements.lock pins the same versions as {args.base}: nothing to compare")
        return 0
    asked = f"environment.with={listed(before)},{listed(after)}"
    command = [sys.executable, str(ROOT / "run.py"), "-m", f"timing.resolve={args.threshold / 2:g}", *overrides]
    done = subprocess.run([*command, asked, f"hydra.sweep.dir={args.sweep_dir}"], check=False)
    if done.returncode == 2:
        return 2
    head = [r for r in csv.DictReader((args.sweep_dir / "report" / "runs.csv").open()) if r["run"].endswith(" #1")][0]
    low = float(head["time_ratio_ci_low"] or "nan")
    slower = head["verdict"] == "slower" and low > 1 and float(head["time_ratio"]) >= 1 + args.threshold
    if head["verdict"] in ("unstable", "cannot tell"):
        print(f"head ({', '.join(after)}) against base: {head['verdict']}: no verdict on this machine now")
        return 3
    print(f"head ({', '.join(after)}) against base: {head['verdict']}; {'fails' if slower else 'passes'} the gate")
    return 1 if slower else 0


if __name__ == "__main__":
    sys.exit(main())

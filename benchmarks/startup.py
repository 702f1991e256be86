#!/usr/bin/env python
"""Start-up: what `run.py --help` and a one-job numpy run cost, beside the imports no run can avoid.

    .venv/bin/python benchmarks/startup.py                           # 7 rounds: prints the table
    .venv/bin/python benchmarks/startup.py --before /tmp/wt_start    # and another checkout's, in the same rounds
    .venv/bin/python benchmarks/startup.py --before /tmp/wt_start --write   # rewrites BENCHMARKS.md's Start-up section

Every command runs in a fresh process, as a user types it. Each round runs each command once, one after the other
(the checkouts' in turn), so a slow phase of a shared machine falls on all of them; a warm-up round is not counted.
Per command: the median wall time over the rounds with its min-max, and the CPU seconds of the process and of the
processes it waited for (the kernel's accounting: the job's worker and fork server included). For `--help` and the
run: the median over the rounds of (its time - the bare imports' time in the same round). `--before CHECKOUT` runs
that checkout's run.py and src/ (a `git worktree` of an earlier commit) with this Python.

Targets (issue 46, on a quiet 2-core machine): `run.py --help` <= 0.6 s; the one-job numpy run <= 0.8 s over the
bare imports. On a shared machine the times stretch with its load, printed beside them.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import resource
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from parity import replace_section  # noqa: E402

BEGIN, END = "<!-- startup:begin -->", "<!-- startup:end -->"
BARE = "import hydra, omegaconf, numpy"
RUN = ("backend=numpy", "tracking=none", "timing.max_time_s=0.1", "timing.rounds=1")
TARGETS = {"help": ("<= 0.6 s", 0.6, False), "run": ("<= 0.8 s over the bare imports", 0.8, True)}
NOTES = [
    "",
    "Where the time went at the start (ad92ef8; `python -X importtime`, cProfile, 2026-11-26): `--help` spent ~60% in",
    "Hydra's help, which composes the whole config and, for `$APP_CONFIG_GROUPS` and `$HYDRA_CONFIG_GROUPS`, lists",
    "each of ~104 group options through a deep copy of the config repository, although the template shows neither;",
    "the rest was importing `runner.app`, whose module-level imports (launch/isolation -> tracking -> record/setups)",
    "brought pandas (~0.4 s here) into every run, and again into the job's fork server (spawned: it re-imports",
    "run.py); launch/rounds brought it too, through runner.report's package. A numpy run composed the config three",
    "times (preflight's check, then Hydra's `get_mode` and its run: ~0.3 s of CPU each here), then waited for its fork",
    "server to start and import (~0.85 s: Hydra and pandas among it), then for the worker to import h5py, rich,",
    "psutil, threadpoolctl and the rest of a job's modules (~0.4 s) before its 0.1 s of timing.",
    "",
    "Changed: `--help` alone is rendered from conf/hydra/help/ in `runner.app.help_text`, before Hydra starts (with",
    "an override beside it, Hydra renders the same template: tests/test_help.py compares the two); `runner.app`",
    "imports Hydra and launch/ in `cli()`; pandas only where frames are built (record/setups, report/); a job's",
    "worker and its fork server never import Hydra (`base_config` is registered by the hydra_plugins package, which",
    "Hydra imports before composing); the fork server of a single run starts right after preflight, so it imports",
    "while Hydra composes, and imports what each job imports (`fork_server.JOB_MODULES`) once for every job it",
    "forks; the help template has no `${...}`, which every composition parsed (~5% of one).",
    "",
    "Then (2026-11-27; timestamps of each process's imports, cProfile): the run composed the config three times, the",
    "main process's critical path; its fork server started after preflight, ready ~0.8 s later. Changed: a single run",
    "typed as overrides alone (no flag, no sweep, no Hydra setting preflight leaves out: `preflight.Checked.as_given`)",
    "runs on preflight's config through Hydra's `run_job` (`launch/single_run.py`: the same .hydra/ files, callbacks,",
    "logging and error report; tests/test_single_run.py compares the files with Hydra's), so it composes once; any",
    "other command line goes through `hydra.main` as before. Its fork server starts before Hydra is imported, as a",
    "spare that imports the job's modules and is handed its backend after preflight (or ended where the job has no",
    "use for it), and it imports `launch/worker.py` instead of the launcher's `isolation` (the tracking package and",
    "the rest). At load ~3.5 the spare was ready ~0.3 s before preflight ended. Since 2026-11-28 the spare imports",
    "only `runner.measure.job` before its backend, the rest of the job's modules after it, as a script imports its",
    "framework first (JAX's jitted step 1.066 -> 1.045 of a script's: the parity section): the run moved from +0.41",
    "to +0.44 s over the bare imports in the same 9 rounds (the table above; nothing before the backend: +0.10 s).",
    "",
    "What is left (measured in quiet moments here, over the bare imports): the main process is the critical path:",
    "the runner's modules (~0.15 s; `runner.tracking` ~0.09 s of it, imported by launch/isolation and the sweep",
    "lifecycle although `tracking=none` never uses it), Hydra's plugin scan (~0.1 s: it imports every launcher plugin,",
    "runner.launch.slurm ~0.03 s of it), the one composition (~0.29 s), Hydra's `run_job` (~0.09 s: deep copies of",
    "the config, three yaml files), then the job's ~0.2 s in its worker (0.1 s of it timing).",
]
# Where issue 46 set the targets (its start-up bullet): the bare imports took 0.27 s, the run 1.2-1.5 s over them.
ISSUE_BARE_S, ISSUE_RUN_OVER_S = 0.27, 1.35


@dataclass
class Command:
    name: str
    label: str
    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)
    wall: list[float] = field(default_factory=list)
    cpu: list[float] = field(default_factory=list)

    def run(self) -> None:
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        start = time.perf_counter()
        done = subprocess.run(self.argv, env={**os.environ, **self.env}, capture_output=True, text=True)
        wall = time.perf_counter() - start
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        if done.returncode != 0:
            raise SystemExit(f"{self.label} failed ({done.returncode}): {done.stderr[-2000:]}")
        self.wall.append(wall)
        self.cpu.append(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime)


def commands(checkout: Path, tag: str, out: Path) -> list[Command]:
    python = sys.executable
    run_py = str(checkout / "run.py")
    run_dir = f"hydra.run.dir={out}/{tag or 'this'}/${{now:%H-%M-%S-%f}}"
    return [
        Command("app", "`python -c 'import runner.app'`", [python, "-c", "import runner.app"],
                {"PYTHONPATH": str(checkout / "src")}),
        Command("help", "`python run.py --help`", [python, run_py, "--help"]),
        Command("run", f"`python run.py {' '.join(RUN)}`", [python, run_py, *RUN, run_dir]),
    ]  # fmt: skip


def measure(checkouts: dict[str, Path], rounds: int, out: Path) -> tuple[Command, dict[str, list[Command]]]:
    bare = Command("bare", f'`python -c "{BARE}"`', [sys.executable, "-c", BARE])
    each = {tag: commands(path, tag, out) for tag, path in checkouts.items()}
    for number in range(rounds + 1):  # the first round warms the caches and is not counted
        for command in [bare, *(c for tag in each for c in each[tag])]:
            command.run()
            if number == 0:
                command.wall.clear()
                command.cpu.clear()
        print(f"round {number}/{rounds} done", file=sys.stderr)
    return bare, each


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):.2f} s ({min(values):.2f}-{max(values):.2f})"


def table(bare: Command, each: dict[str, list[Command]]) -> list[str]:
    tags = list(each)
    head = " | ".join(f"{tag or 'wall'}: median (min-max)" for tag in tags)
    lines = [
        f"| command | {head} | CPU s (median{', ' + ', '.join(t for t in tags) if len(tags) > 1 else ''}) | target |",
        "|---|" + "---|" * (len(tags) + 2),
    ]
    lines.append(f"| bare imports {bare.label} | " + " | ".join(spread(bare.wall) for _ in tags) + " | "
                 f"{statistics.median(bare.cpu):.2f} | |")  # fmt: skip
    for index, first in enumerate(each[tags[0]]):
        row = [each[tag][index] for tag in tags]
        cells = [spread(c.wall) for c in row]
        cpu = ", ".join(f"{statistics.median(c.cpu):.2f}" for c in row)
        target, _, over = TARGETS.get(first.name, ("", 0.0, False))
        if first.name in TARGETS:
            overs = [statistics.median(w - b for w, b in zip(c.wall, bare.wall, strict=True)) for c in row]
            cells = [f"{cell}; over the bare imports {o:+.2f} s" for cell, o in zip(cells, overs, strict=True)]
        lines.append(f"| {first.label} | " + " | ".join(cells) + f" | {cpu} | {target} |")
    return lines


def verdicts(bare: Command, commands_: list[Command]) -> list[str]:
    said = []
    for command in commands_:
        if command.name not in TARGETS:
            continue
        target, limit, over = TARGETS[command.name]
        value = statistics.median(
            (w - b) if over else w for w, b in zip(command.wall, bare.wall, strict=True)
        )  # fmt: skip
        said.append(f"{command.name}: {value:.2f} s ({target}: {'met' if value <= limit else 'not met'} here)")
    return said


def scaled(bare: Command, each: dict[str, list[Command]]) -> str:
    """The run's figure after, as it would read on the machine where the targets were set: scaled by the bare imports,
    and (with --before) by the run's figure before."""
    run = {tag: next(c for c in commands_ if c.name == "run") for tag, commands_ in each.items()}
    over = {tag: statistics.median(w - b for w, b in zip(c.wall, bare.wall, strict=True)) for tag, c in run.items()}
    after = over[list(over)[-1]]
    said = (
        f"On the machine where the targets were set (bare imports {ISSUE_BARE_S} s, the run +{ISSUE_RUN_OVER_S} s "
        f"before) the run after would read +{after * ISSUE_BARE_S / statistics.median(bare.wall):.2f} s scaled by "
        "the bare imports"
    )
    if "before" in over:
        said += f", +{after * ISSUE_RUN_OVER_S / over['before']:.2f} s scaled by the run before"
    return said + "."


def conditions(load_before: tuple[float, ...], load_after: tuple[float, ...], rounds: int) -> str:
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor())  # fmt: skip
    return (
        f"{datetime.date.today().isoformat()}; {cpu}, {os.cpu_count()} cores shared with other work: load average "
        f"(1, 5, 15 min) {', '.join(f'{v:.1f}' for v in load_before)} before, "
        f"{', '.join(f'{v:.1f}' for v in load_after)} after; Python {platform.python_version()}; "
        f"{rounds} rounds after a warm-up round"
    )


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--before", type=Path, help="another checkout (e.g. a git worktree), measured alongside")
    parser.add_argument("--write", action="store_true", help="rewrite the Start-up section of BENCHMARKS.md")
    args = parser.parse_args(argv)
    checkouts = {"before": args.before.resolve(), "after": ROOT} if args.before else {"": ROOT}
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="startup-") as out:
        bare, each = measure(checkouts, args.rounds, Path(out))
    load_after = os.getloadavg()
    command = shlex.join([".venv/bin/python", "benchmarks/startup.py", *argv])
    before = ""
    if args.before:
        commit = subprocess.run(["git", "-C", str(args.before), "rev-parse", "--short", "HEAD"], capture_output=True)
        before = f" before: {args.before}, a worktree of {commit.stdout.decode().strip() or 'another commit'}; after:"
        before += " this checkout."
    lines = [
        BEGIN,
        "## Start-up",
        "",
        f"Regenerate: `{command}` (rewrites only this section; `run_all.py` keeps it). Each command in a fresh",
        "process, the commands in turn in each round; the run writes into a scratch `hydra.run.dir`." + before,
        "",
        f"Conditions: {conditions(load_before, load_after, args.rounds)}.",
        "",
        *table(bare, each),
        "",
        "Targets: " + "; ".join(verdicts(bare, each[list(each)[-1]])) + ". " + scaled(bare, each),
        *NOTES,
        END,
    ]
    text = "\n".join(lines)
    print(text)
    if args.write:
        path = ROOT / "BENCHMARKS.md"
        path.write_text(replace_section(path.read_text(), text, BEGIN, END))
        print(f"wrote the Start-up section of {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

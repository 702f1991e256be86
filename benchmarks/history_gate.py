#!/usr/bin/env python
"""The CI gate's budget, measured: nights of a small real suite into one store, and after each night the gate a CI
job runs, `runner history --fail-on regression`, with and without `--confirm`.

    .venv/bin/python benchmarks/history_gate.py                          # 50 nights, about 30 minutes on 2 cores
    .venv/bin/python benchmarks/history_gate.py --nights 27 --step-at 18 --busy 9,10,11 --new-within 3 --keep /tmp/g
    .venv/bin/python benchmarks/history_gate.py --nights 12 --step-at 8 --busy 4,5,6 --keep /tmp/gate
    .venv/bin/python benchmarks/history_gate.py --nights 56 --first-night 52 --step-at 50 --keep /tmp/gate  # resume
    .venv/bin/python benchmarks/history_gate.py --reread /tmp/gate --step-at 50 --new-within 3  # the gate as it is now
    .venv/bin/python benchmarks/history_gate.py --nights 24 --step-at 99 --busy "" --budget 0.3 --processes 1 \
        --min-nights 99 --keep /tmp/aa   # 24 A/A nights, about 25 minutes on 2 busy cores (load 10); then per series:
    .venv/bin/python benchmarks/history_gate.py --reread /tmp/aa --step-at 99 --min-nights 5 --in-process
    .venv/bin/python benchmarks/history_gate.py --cases "model=mlp backend=jax,tensorflow mode=function" \
        --nights 24 --step-at 99 --busy "" --budget 0.3 --processes 1 --min-nights 99 --keep /tmp/aa-compiled

Each night is one `run.py -m` process (its own interpreter, as a nightly job is) of 6 cases, model=chain,mlp,matmul
on numpy and torch, task=inference, threads=1, with the shipped control (`control=matmul`) timed in the same rounds,
into one sqlite store. Nothing changes between nights (A/A) but:

- from --step-at on, model=chain (tests/plugin/chain_model.py) does --extra more work (0.1: 11 layers, not 10), its
  config and case unchanged, as a library upgrade changes a model's work: the gate must flag it within 3 nights;
- on the --busy nights a burner runs beside the sweep, a slowdown of the whole machine: where a case is fitted
  relative to its control, no alarm may follow. --burner cpu: busy 50 ms, asleep 50 ms (half a core); --burner
  memory: a core copying 256 MB arrays throughout (STREAMER), which slows every job's blocks, not only those it
  preempts; --burner cores: every core spun throughout (SPINNER).

Every job gets --budget s (timing.max_time_s) and up to --processes worker processes (timing.processes, as many as
the budget affords: at 1.5 s three for model=chain, one for the 20 ms matmuls); a process can run a few percent
slower than its job's others throughout, and the job's typical time, the median over rounds taken in turn by its
processes, is not moved by one such process of three.

From --min-nights on, after each night the gate runs as CI runs it (a fresh `python -m runner history` process):
plainly, and where that fails, again with --confirm, whose re-run of each flagged case joins the store as a CI job's
would. A failure before --step-at, or on any case but chain's, is a false alarm. Prints a row per night, then the
nights the gate failed with and without --confirm and how many nights the step took to be flagged.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "benchmarks")]
from history_real import BURNER, PLUGIN, PYTHON  # noqa: E402

# A whole core copying 256 MB arrays without pause, for argv[1] seconds: the memory bus and the shared L3 cache
# busy, which slows the blocks of every job, not only those it preempts (the fastest block of a turn, what the
# runner's typical time reads, steps round a burner that only takes turns on a core).
STREAMER = """
import sys, time
import numpy as np
end, a = time.monotonic() + float(sys.argv[1]), np.ones(2**25)
b = np.empty_like(a)
while time.monotonic() < end:
    np.copyto(b, a)
"""
# Every core spun without pause for argv[1] seconds (one process a core, each ending when the first is killed): a
# job's 20 ms calls then take 1.9x as long, every block preempted, while 43 us ones do not move.
SPINNER = """
import os, sys, time
end, first = time.monotonic() + float(sys.argv[1]), os.getpid()
for _ in range(os.cpu_count() - 1):
    if os.fork() == 0:
        break
while time.monotonic() < end and (os.getpid() == first or os.getppid() == first):
    pass
"""
BURNERS = {"cpu": BURNER, "memory": STREAMER, "cores": SPINNER}

EXPERIMENT = "history-gate"
SLOWED = "chain"


def night_command(
    uri: str, out: Path, budget: float, processes: int, slowed: str = SLOWED, cases: str = ""
) -> list[str]:
    """A night's sweep: the suite of 6 cases, or `cases` (overrides, e.g. 'model=mlp backend=jax,tensorflow
    mode=function': the compiled first call and its parts)."""
    return [
        PYTHON,
        str(ROOT / "run.py"),
        "-m",
        f"hydra.searchpath=[file://{PLUGIN / 'conf'}]",
        *(cases.split() or [f"model={slowed},mlp,matmul", "backend=numpy,torch"]),
        "task=inference",
        "threads=1",
        "control=matmul",
        f"timing.max_time_s={budget:g}",
        f"timing.processes={processes}",
        f"tracking.uri={uri}",
        f"tracking.experiment={EXPERIMENT}",
        f"hydra.sweep.dir={out}",
    ]


def environment(extra: float) -> dict[str, str]:
    path = os.pathsep.join([str(PLUGIN), str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])
    return {**os.environ, "PYTHONPATH": path, "RUNNER_TEST_EXTRA_WORK": f"{extra:g}"}


def run_night(
    uri: str,
    out: Path,
    budget: float,
    processes: int,
    extra: float,
    burner_code: str | None,
    slowed: str,
    cases: str = "",
) -> float:
    """One night's sweep, with `burner_code` running beside it (if any); its wall time."""
    burner = subprocess.Popen([PYTHON, "-c", burner_code, "600"]) if burner_code else None
    start = time.perf_counter()
    try:
        command = night_command(uri, out, budget, processes, slowed, cases)
        done = subprocess.run(command, cwd=ROOT, env=environment(extra), capture_output=True, text=True, timeout=900)
    finally:
        if burner is not None:
            burner.kill()
            burner.wait()
    if done.returncode != 0:
        raise SystemExit(f"night {out.name} exited {done.returncode}:\n{done.stderr[-3000:]}")
    return time.perf_counter() - start


def gate(uri: str, extra: float, confirm: bool, nights: list[Path] | None = None, within: int = 0) -> list[str]:
    """The cases the gate fails on (its `failing: ` lines), run as CI runs it; a --confirm re-run does the work the
    night did (`extra`). `nights`: read those nights' sweep folders instead of the store (a re-read up to a night);
    `within`: --new-within."""
    command = [PYTHON, "-m", "runner", "history"]
    command += [str(n) for n in nights] if nights else ["--tracking-uri", uri, "--experiment", EXPERIMENT]
    command += ["--fail-on", "regression", *(["--confirm"] if confirm else [])]
    command += ["--new-within", str(within)] if within else []
    done = subprocess.run(command, cwd=ROOT, env=environment(extra), capture_output=True, text=True, timeout=900)
    failing = [line.removeprefix("failing: ") for line in done.stderr.splitlines() if line.startswith("failing: ")]
    if done.returncode not in (0, 1) or (done.returncode == 1) != bool(failing):
        raise SystemExit(f"runner history exited {done.returncode}:\n{done.stderr[-3000:]}")
    return failing


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nights", type=int, default=50)
    parser.add_argument("--step-at", type=int, default=40, help="the first night (0-based) with the extra work")
    parser.add_argument("--slowed", default=SLOWED, help="the model given --extra work: chain (10 layers: steps of "
                        "10%%) or chain20 (20 layers: 5%%)")  # fmt: skip
    parser.add_argument("--cases", default="", help="a night's cases as overrides instead of the suite's, e.g. "
                        "'model=mlp backend=jax,tensorflow mode=function'")  # fmt: skip
    parser.add_argument("--extra", type=float, default=0.1, help="the extra work of model=chain (0.1: 10%% more)")
    parser.add_argument("--busy", default="20,21,22", help="nights (0-based) with the burner beside them")
    parser.add_argument("--burner", choices=BURNERS, default="cpu", help="cpu: half a core in bursts; memory: a "
                        "core copying 256 MB arrays throughout; cores: every core spun")  # fmt: skip
    parser.add_argument("--min-nights", type=int, default=8, help="the first night after which the gate runs")
    parser.add_argument("--budget", type=float, default=1.5, help="timing.max_time_s of every job")
    parser.add_argument(
        "--processes", type=int, default=3, help="timing.processes of every job (as many as its budget affords)"
    )
    parser.add_argument("--keep", type=Path, help="make the store and nights here (kept) instead of a temporary folder")
    parser.add_argument("--first-night", type=int, default=0, help="resume a --keep folder's nights from this one")
    parser.add_argument("--reread", type=Path, help="only read a kept folder's nights again, night by night")
    parser.add_argument("--new-within", type=int, default=0, help="the gate's --new-within (0: not given)")
    parser.add_argument("--in-process", action="store_true", help="with --reread: each night's gate read in this "
                        "process, not a fresh one (the same command, one import)")  # fmt: skip
    args = parser.parse_args()
    if args.reread:
        return reread(args.reread, args.step_at, args.min_nights, args.new_within, args.in_process)
    busy = {int(n) for n in args.busy.split(",") if n.strip()}
    folder = args.keep or Path(tempfile.mkdtemp(prefix="history-gate-"))
    folder.mkdir(parents=True, exist_ok=True)
    uri = f"sqlite:///{folder / 'mlflow.db'}"
    plain_failed, confirmed_failed, flagged_after = [], [], None
    for night in range(args.first_night, args.nights):
        extra = args.extra if night >= args.step_at else 0.0
        burner = BURNERS[args.burner] if night in busy else None
        out = folder / f"night-{night:02d}"
        wall = run_night(uri, out, args.budget, args.processes, extra, burner, args.slowed, args.cases)
        said = f"night {night:2d}: extra {extra:g}, burner {args.burner if night in busy else 'off'}, {wall:.0f} s"
        if night + 1 >= args.min_nights:
            plain = gate(uri, extra, confirm=False, within=args.new_within)
            confirmed = gate(uri, extra, confirm=True, within=args.new_within) if plain else []
            false_plain = [c for c in plain if night < args.step_at or SLOWED not in c]
            false_confirmed = [c for c in confirmed if night < args.step_at or SLOWED not in c]
            plain_failed += [night] if false_plain else []
            confirmed_failed += [night] if false_confirmed else []
            if flagged_after is None and night >= args.step_at and any(SLOWED in c for c in plain):
                flagged_after = night - args.step_at + 1
            said += f"; gate: {len(plain)} failing, {len(confirmed)} after --confirm"
            said += "".join(f"\n    {c}" for c in confirmed or plain)
        print(said, flush=True)
    gated = args.nights - max(args.min_nights - 1, args.first_night)  # this invocation's nights
    print(f"\nnights gated: {gated}; with a false alarm: {len(plain_failed)} plainly {plain_failed}, "
          f"{len(confirmed_failed)} with --confirm {confirmed_failed}")  # fmt: skip
    print(f"the {args.extra:.0%} step from night {args.step_at}: flagged after {flagged_after} night(s)")
    print(f"store: {uri}")


def reread(folder: Path, step_at: int, min_nights: int, within: int, in_process: bool = False) -> None:
    """The gate as it is now over a kept folder's nights, night by night (each night's history the runs up to it,
    read from their sweep folders: a --confirm's re-runs of that time are not among them): which nights would fail
    falsely, over every series together and per series (the typical time, and each figure: the first call and its
    parts, load, memory), and after how many nights the step was flagged. `in_process`: each night's gate read by
    runner.cli.main in this process (one import of MLflow and the frameworks' names, not one a night), the same
    command otherwise."""
    nights = sorted(folder.glob("night-[0-9][0-9]"))
    false, flagged_after, by_series = [], None, {}
    for night in range(min_nights - 1, len(nights)):
        read = gate_in_process if in_process else gate
        failing = read("", 0.0, confirm=False, nights=nights[: night + 1], within=within)
        wrong = [c for c in failing if night < step_at or SLOWED not in c]
        false += [night] if wrong else []
        for series in {series_of(c) for c in wrong}:
            by_series.setdefault(series, []).append(night)
        if flagged_after is None and night >= step_at and any(SLOWED in c for c in failing):
            flagged_after = night - step_at + 1
        print(f"night {night:2d}: {len(failing)} failing" + "".join(f"\n    {c}" for c in failing), flush=True)
    gated = len(nights) - min_nights + 1
    print(f"\nnights gated: {gated}; with a false alarm: {len(false)} {false}")
    for series in fitted_series(nights):
        print(f"  {series}: {len(by_series.get(series, []))} of {gated} nights {by_series.get(series, [])}")
    print(f"the step from night {step_at}: flagged after {flagged_after} night(s)")


def series_of(line: str) -> str:
    """The series a gate's failing line is about: a figure's name where it leads its step ('CASE: first call:
    regression 1.4x ...'), the numbers' ('CASE: numeric change: ...'), else the typical time ('CASE: regression:
    ...')."""
    from runner.history.narrow import series_names

    said = line.split(": ")[1] if ": " in line else ""
    if said == "numeric change":
        return "numbers against float64"
    return said if said in series_names().values() else "typical time"


def fitted_series(nights: list[Path]) -> list[str]:
    """Every series the history of all `nights` fits (--json's `series`), as a line says each, in the order there."""
    import json

    out = _in_process("history", *map(str, nights), "--json")[0]
    return list(dict.fromkeys(s["said"] for case in json.loads(out) for s in case["series"]))


def gate_in_process(
    uri: str, extra: float, confirm: bool, nights: list[Path] | None = None, within: int = 0
) -> list[str]:
    """gate's reading of `nights` (no store, no re-run), by runner.cli.main in this process."""
    command = [
        "history",
        *map(str, nights or []),
        "--fail-on",
        "regression",
        *(["--new-within", str(within)] if within else []),
    ]
    _, err, status = _in_process(*command)
    failing = [line.removeprefix("failing: ") for line in err.splitlines() if line.startswith("failing: ")]
    if status not in (0, 1) or (status == 1) != bool(failing):
        raise SystemExit(f"runner history exited {status}:\n{err[-3000:]}")
    return failing


def _in_process(*args: str) -> tuple[str, str, int]:
    import contextlib
    import io

    from runner import cli

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        status = cli.main(list(args))
    return out.getvalue(), err.getvalue(), status


if __name__ == "__main__":
    main()

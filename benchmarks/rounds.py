#!/usr/bin/env python
"""Does a comparison hold on a busy machine? Seed 003's eager-vs-function sweep, repeated in both job
orders while another process burns one core for 1.5 s out of every 3 s: one job after the other
(timing.rounds=1) against interleaved rounds (the default), in the same run.

    .venv/bin/python benchmarks/rounds.py                 # 3 repeats x 2 orders x 2 ways x 3 budgets, ~25 min
    .venv/bin/python benchmarks/rounds.py --repeats 1 --budgets 3     # a quick look

Beside the spread between repeats it prints the spread the sweeps' own intervals predict (their standard
errors, over as many repeats), and how unsteady the machine itself was: a pure-Python loop's p90/p10.

Rewrites the rounds section of BENCHMARKS.md (between the markers below); run_all.py keeps it.
"""

from __future__ import annotations

import argparse
import datetime
import itertools
import math
import multiprocessing
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "benchmarks"))  # parity.replace_section, also when imported from tests
from runner.config import TimingConfig  # noqa: E402
from runner.report.ratio import PROCESS_SD, batch_count, half_width  # noqa: E402

BEGIN, END = "<!-- rounds:begin -->", "<!-- rounds:end -->"
SWEEP = ("backend=tensorflow", "model=mlp", "task=gradients", "batch_size=512", "tracking=none")
ISSUE_BUDGET_S = 3.0  # seed 003's timing.max_time_s: the target row
ORDERS = ("eager,function", "function,eager")
BURN_S, PERIOD_S = 1.5, 3.0
TARGET = 1.10
FINDINGS = [
    "",
    "What the runs on the way here found (same burner, same sweep, 2026-11-23):",
    "",
    "- Rounds close in time correlate, so the interval is Student's t over batch means (40 rounds: 8 batches of "
    "5 consecutive rounds), no longer over single rounds. In the 12 sweeps of two earlier runs at "
    "`max_time_s=3` the per-round log ratios correlated up to 0.48 at lag 1 (7 of 12 above 0.1): "
    "the machine's slow and fast phases "
    "outlast a round. Over single rounds the intervals predicted a max/min of 1.08-1.09x over six repeats where "
    "the repeats moved 1.12-1.17x (three runs), and in two of the three they did not all overlap; over batch "
    "means, the two runs whose samples were kept overlapped. In a simulation (40 rounds, lag-1 correlation 0.3) "
    "the old interval held the true "
    "ratio 85 times in 100, the new one 94 (tests/test_ratio.py). The ratio itself did not change.",
    "- The 3 s row is at the edge of its target: 1.104 in this run (intervals predict 1.094); the earlier runs, "
    "same code for the ratio, moved 1.12x, 1.16x and 1.17x. At the default budget (5 s) and at 12 s the repeats "
    "moved 1.08x here (12 s in an earlier run: 1.06x). One job after the other moved 1.26-1.81x at every budget: "
    "each job meets its own phases of the machine, however long it samples. The wall time at 12 s (1.11) is "
    "two of the six sweeps measured one after the other stopping early, their spread under 3% (34 s against "
    "45 s); no sweep in rounds did.",
    "- The number of rounds decides the interval, not the length of a turn. A round's eager/function ratio "
    "spread by about 19% (sd of its log) with turns of 37 ms and of 67 ms alike, so a turn's median is one draw "
    "of the machine's phase. With 100 rounds each interval halved (standard error 0.017 against 0.033), but six "
    "repeats moved by 1.08x in one run and by 1.20x in the next (one pair: 4.11 against 3.41): the default "
    "stays 40.",
    "- The machine itself is unsteady, burner or not: a plain-Python loop's p90/p10 went from 1.2 to 2.1 within "
    "minutes, with consecutive calls correlated (lag 1: 0.8). Two identical TensorFlow jobs' per-round "
    "medians correlated only 0.1-0.2, so these phases are not shared by the jobs of a round: rounds average "
    "them out, they do not cancel them.",
    "- Counting only the quiet rounds (no other process runnable in either turn) was tried and dropped: "
    "beside the burner eager slows more than tf.function (busy rounds gave a 3-16% higher ratio), but "
    "keeping only the quiet half of the rounds made the repeats move more, 1.19-1.22x against 1.12-1.16x "
    "with all rounds, in two runs of six sweeps.",
    "- The turns first had half of `max_time_s` (1.5 s of sampling here) while a job measured alone samples "
    "for what calibration and warm-up leave (2.7 s); they now share the same.",
    "- Between processes: identical jobs in different worker processes (three TensorFlow eager jobs per sweep, "
    "four sweeps) came out 0.97-1.06x of the fastest, within their intervals in 7 of 8 comparisons. "
    "Several worker processes per job (pyperf's "
    "answer, one framework import each) were not built: with batch means the repeats move about as far as "
    "their intervals predict.",
    "- The measurement of busyness was first wrong: a reading at the start of a turn counted the process whose "
    "turn had just ended (still winding down) as another runnable process, so half of all rounds looked busy "
    "on a quiet machine. The first reading now comes 0.1 s into a turn or at its end.",
]


def burn(stop) -> None:
    """One core busy for BURN_S out of every PERIOD_S, until `stop` is set."""
    while not stop.is_set():
        end = time.perf_counter() + BURN_S
        while time.perf_counter() < end:
            pass
        stop.wait(PERIOD_S - BURN_S)


def machine_noise(seconds: float = 3.0) -> float:
    """How unsteady the machine runs plain Python: p90/p10 of a ~1 ms loop's times (1.0: perfectly steady)."""
    import numpy as np

    times, end = [], time.perf_counter() + seconds
    while time.perf_counter() < end:
        start = time.perf_counter()
        sum(i * i for i in range(10_000))
        times.append(time.perf_counter() - start)
    return float(np.percentile(times, 90) / np.percentile(times, 10))


def expected_range(n: int) -> float:
    """The expected max - min of n standard normal draws (2.53 for 6)."""
    import numpy as np

    return float(np.ptp(np.random.default_rng(0).standard_normal((200_000, n)), axis=1).mean())


def standard_error(low: float, high: float, rounds: int) -> float:
    """The standard error of the log ratio behind a 95% interval over `rounds` rounds, the processes' spread
    included: what runner.report.ratio's half width (Student's t over batch means, beside PROCESS_SD per job)
    comes from, solved for the rounds' part."""
    from scipy import optimize

    half, df = math.log(high / low) / 2, batch_count(rounds) - 1
    if half <= half_width(0.0, df, 0.95, PROCESS_SD):
        return math.sqrt(2) * PROCESS_SD
    sem = optimize.brentq(lambda s: half_width(s, df, 0.95, PROCESS_SD) - half, 1e-12, half)
    return math.sqrt(sem**2 + 2 * PROCESS_SD**2)


def sweep(order: str, rounds: int, budget_s: float, out: Path) -> dict:
    """One sweep; eager's time / function's time, its interval (rounds only) and the wall time."""
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, str(ROOT / "run.py"), "-m", *SWEEP, f"mode={order}", f"timing.rounds={rounds}"]
        + [f"timing.max_time_s={budget_s:g}", f"hydra.sweep.dir={out}"],
        capture_output=True,
        text=True,
    )
    wall_s = time.perf_counter() - start
    if done.returncode != 0:
        raise RuntimeError(f"sweep failed: {done.stderr[-2000:]}")
    rows = pd.read_csv(out / "report" / "runs.csv").set_index("mode")
    eager, function = rows.loc["eager"], rows.loc["function"]
    ratio = eager["time_median_s"] / function["time_median_s"]
    low, high, se = math.nan, math.nan, math.nan
    if function["within_noise"] == "fastest":  # eager's row holds the ratio to function, with its interval
        ratio, low, high = eager["time_ratio"], eager["time_ratio_ci_low"], eager["time_ratio_ci_high"]
        if not math.isnan(low):
            se = standard_error(low, high, int(str(eager["time_ratio_basis"]).split()[0]))
    busy = float(rows["machine_other_runnable"].mean()) if "machine_other_runnable" in rows else math.nan
    return {"ratio": ratio, "low": low, "high": high, "se": se, "wall_s": wall_s, "other_runnable": busy}


def measure(repeats: int, rounds: int, budgets: list[float]) -> pd.DataFrame:
    stop = multiprocessing.get_context("spawn").Event()
    burner = multiprocessing.get_context("spawn").Process(target=burn, args=(stop,), daemon=True)
    burner.start()
    records = []
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for budget, repeat, order in itertools.product(budgets, range(repeats), ORDERS):
                ways = (1, rounds) if len(records) % 4 == 0 else (rounds, 1)  # neither way always goes first
                for way in ways:
                    out = Path(tmp) / f"{budget:g}-{repeat}-{order.replace(',', '-')}-{way}"
                    record = {"budget_s": budget, "repeat": repeat + 1, "order": order, "rounds": way}
                    record |= sweep(order, way, budget, out)
                    print(record, flush=True)
                    records.append(record)
    finally:
        stop.set()
        burner.join()
    return pd.DataFrame(records)


def overlap(frame: pd.DataFrame) -> bool:
    """Whether every interval overlaps every other (a common point: the largest low <= the smallest high)."""
    return bool(frame["low"].max() <= frame["high"].min())


def spread(ratios: pd.Series) -> float:
    return float(ratios.max() / ratios.min())


def predicted_spread(interleaved: pd.DataFrame) -> float:
    """The max/min the sweeps' own intervals predict over as many repeats: exp(expected range x their SE)."""
    return math.exp(expected_range(len(interleaved)) * math.sqrt((interleaved["se"] ** 2).mean()))


def summary_rows(frame: pd.DataFrame, rounds: int) -> list[str]:
    """Per budget: the spread both ways, the spread the intervals predict, overlap, and the wall-time cost."""
    lines = []
    for budget, group in frame.groupby("budget_s"):
        sequential, interleaved = group[group["rounds"] == 1], group[group["rounds"] == rounds]
        overlapping = overlap(interleaved)
        target = f"<= {TARGET:.2f} with rounds, and the intervals of the repeats overlap"
        verdict = "meets target" if spread(interleaved["ratio"]) <= TARGET and overlapping else "MISSES target"
        if budget != ISSUE_BUDGET_S:
            target, verdict = "(a longer budget, for comparison)", ""
        lines.append(
            f"| max/min of the eager/function ratio over {len(sequential)} sweeps, `max_time_s={budget:g}` | one job "
            f"after the other: **{spread(sequential['ratio']):.3f}**; {rounds} rounds: "
            f"**{spread(interleaved['ratio']):.3f}** (their intervals predict {predicted_spread(interleaved):.3f}; "
            f"overlap: {'yes' if overlapping else 'no'}) | {target} | {verdict} |"
        )
        cost = interleaved["wall_s"].mean() / sequential["wall_s"].mean()
        lines.append(
            f"| wall time of a sweep, rounds / one after the other, `max_time_s={budget:g}` | {cost:.2f} "
            f"({interleaved['wall_s'].mean():.1f} s vs {sequential['wall_s'].mean():.1f} s) | <= 1.10 | "
            f"{'meets target' if cost <= 1.10 else 'MISSES target'} |"
        )
    return lines


def section(frame: pd.DataFrame, rounds: int, load: tuple[float, float], noise: tuple[float, float]) -> str:
    from runner.record.environment import cpu_name

    cells = [
        f"| {r.budget_s:g} s | {r.repeat} | {r.order} | {r.rounds} | {r.ratio:.2f} | "
        + (f"{r.low:.2f}-{r.high:.2f}" if not math.isnan(r.low) else "none (1 round)")
        + f" | {r.other_runnable:.1f} | {r.wall_s:.1f} s |"
        for r in frame.itertuples()
    ]
    lines = [
        BEGIN,
        "## Comparisons on a busy machine: interleaved rounds",
        "",
        "Regenerate: `.venv/bin/python benchmarks/rounds.py` (this run; rewrites only this section). Seed 003's "
        f"comparison, `run.py -m {' '.join(SWEEP)} mode=eager,function timing.max_time_s={ISSUE_BUDGET_S:g}`, "
        f"repeated in both job orders while a second process burns one core for {BURN_S:g} s out of every "
        f"{PERIOD_S:g} s; each sweep run one job after the other (`timing.rounds=1`, as before) and in {rounds} "
        "interleaved rounds (the default), the two alternating; then again with a longer budget. Ratio = eager's "
        "time / function's; with rounds, the geometric mean of the per-round ratios and its 95% interval "
        "(Student's t over batch means of consecutive rounds, `runner.report.ratio`). "
        "'Their intervals predict': the max/min expected over as "
        "many repeats from the sweeps' own standard errors, if the intervals tell the whole truth.",
        "",
        f"Conditions: {cpu_name()}, {os.cpu_count()} cores shared with other work (load average {load[0]:.2f} "
        f"before, {load[1]:.2f} after); a plain-Python loop's p90/p10 without the burner, before and after: "
        f"{noise[0]:.2f}, {noise[1]:.2f} (1.00 is a steady machine); Python {platform.python_version()}; "
        f"{datetime.date.today()}.",
        "",
        "| row | measured | target | verdict |",
        "|---|---|---|---|",
        *summary_rows(frame, rounds),
        "",
        "| budget | repeat | order | rounds | eager / function | 95% interval | other runnable threads | wall time |",
        "|---|---|---|---|---|---|---|---|",
        *cells,
        *FINDINGS,
        END,
    ]
    return "\n".join(lines)


def replace_section(text: str, new: str) -> str:
    """`text` with its rounds section replaced by `new` (appended where there is none)."""
    import parity

    return parity.replace_section(text, new, BEGIN, END)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=TimingConfig.rounds, help="the interleaved side's timing.rounds")
    parser.add_argument("--budgets", default="3,5,12", help="timing.max_time_s values, comma-separated")
    parser.add_argument("--out", type=Path, default=ROOT / "BENCHMARKS.md")
    args = parser.parse_args()
    load_before, noise_before = os.getloadavg()[0], machine_noise()
    frame = measure(args.repeats, args.rounds, [float(b) for b in args.budgets.split(",")])
    load_after, noise_after = os.getloadavg()[0], machine_noise()
    text = section(frame, args.rounds, (load_before, load_after), (noise_before, noise_after))
    print(text)
    args.out.write_text(replace_section(args.out.read_text() if args.out.exists() else "", text))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()

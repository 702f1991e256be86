#!/usr/bin/env python
"""Intervals for a generation at a real size, where one generation fills the default budget: A/A and a known 1.3x.

Each sweep is two identical jobs (`seed=0,1`: the weights change, not the cost) of `task=generate` at
SmolLM2-135M's sizes on one backend, at the default timing. One round fits, so the comparison rests on the decode
steps (runner.report.comparison: the parts of a call). Each sweep is read twice: as measured (A/A: identical jobs
should be called different about 1 time in 20), and with the second job's samples and decode steps multiplied by
1.3 (a known 1.3x difference on the measured noise: it should be called slower).

    .venv/bin/python benchmarks/generation_intervals.py --sweeps 10            # about 1 minute a sweep on 2 cores
    .venv/bin/python benchmarks/generation_intervals.py --sweeps 3 --backend numpy
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from runner.record import runs  # noqa: E402
from runner.record.table import format_interval, format_ratio  # noqa: E402
from runner.report import frames  # noqa: E402

FACTOR = 1.3


def sweep(folder: Path, backend: str, model: str) -> Path:
    command = [sys.executable, "run.py", "-m", f"model={model}", "task=generate", "batch_size=1"]
    command += [f"backend={backend}", "seed=0,1", "tracking=none", f"hydra.sweep.dir={folder}"]
    subprocess.run(command, cwd=ROOT, check=True, capture_output=True)
    return folder


def read(folder: Path, factor: float = 1.0) -> dict:
    """The second job against the first (whichever is fastest is the baseline), its samples times `factor`."""
    frame = frames.frame(runs.from_path(folder)).sort_values("params.seed").reset_index(drop=True)
    for column in ("samples_s", "sample_parts"):
        frame[column] = [values * (factor if i == 1 else 1.0) for i, values in enumerate(frame[column])]
    compared = frames.compare(frame)
    other = compared[compared["verdict"] != "fastest"].iloc[0]
    slower = other["params.seed"] == 1  # the second job is the one compared
    ratio, low, high = (other[k] for k in ("time_ratio", "time_ratio_ci_low", "time_ratio_ci_high"))
    if not slower:  # the first job against the second: read it the other way round
        ratio, low, high = 1 / ratio, 1 / high, 1 / low
    busy = compared["metrics.machine_other_runnable"].max()
    said = {"verdict": other["verdict"], "basis": other["time_ratio_basis"], "busy": busy}
    return {"ratio": ratio, "low": low, "high": high, **said}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sweeps", type=int, default=10)
    parser.add_argument("--backend", default="torch")
    parser.add_argument("--model", default="llama_smollm2_135m")
    args = parser.parse_args()
    print("| sweep | A/A: second / first | verdict | x1.3: second / first | verdict | ratio from | other runnable |")
    print("|---|---|---|---|---|---|---|")
    called = found = 0
    with tempfile.TemporaryDirectory(prefix="generation-intervals-") as tmp:
        for i in range(args.sweeps):
            folder = sweep(Path(tmp, str(i)), args.backend, args.model)
            same, slower = read(folder), read(folder, FACTOR)
            called += same["verdict"] in ("slower", "faster")
            found += slower["verdict"] == "slower"
            cells = [f"{format_ratio(r['ratio'])} [{format_interval((r['low'], r['high']))}]" for r in (same, slower)]
            row = [
                str(i + 1),
                cells[0],
                same["verdict"],
                cells[1],
                slower["verdict"],
                same["basis"],
                f"{same['busy']:.1f}",
            ]
            print(f"| {' | '.join(row)} |")
    print(f"\nA/A called different: {called} of {args.sweeps}; 1.3x called slower: {found} of {args.sweeps}")


if __name__ == "__main__":
    main()

#!/usr/bin/env python
"""How prefill time grows with the prompt's length: a sweep of model.prompt_len, and its time to first token per
prompt token with the exponent k of time ~ length^k fitted, with its 95% interval (for BENCHMARKS.md).

    .venv/bin/python benchmarks/prefill_scaling.py              # runs the sweep below, then reads it
    .venv/bin/python benchmarks/prefill_scaling.py SWEEP_DIR    # reads a sweep already run

The sweep (a small Llama: 4 layers, d_model 256, 8 heads over 4 key/value heads, ffn 768, vocab 8192):

    .venv/bin/python run.py -m model=llama model.layers=4 model.d_model=256 model.heads=8 model.kv_heads=4 \
        model.ffn=768 model.vocab_size=8192 model.context=2048 task=generate task.new_tokens=1 \
        model.prompt_len=16,32,64,128,256,512,1024 backend=torch tracking=none timing.max_time_s=3

task.new_tokens=1: a generation is the prefill and its one token, so the time to first token is the prefill's. Each
run's TTFT is its samples' median; the fit is least squares of log TTFT on log length (Student's t for the slope's
interval), over every length and over 128 and longer, where per-call overhead no longer dominates; the local exponent
between neighbouring lengths says where the growth turns from the projections' (k = 1) towards attention's (k = 2).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
from scipy import stats

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from runner.record.table import format_seconds  # noqa: E402

LENGTHS = (16, 32, 64, 128, 256, 512, 1024)
SIZE = ["model.layers=4", "model.d_model=256", "model.heads=8", "model.kv_heads=4", "model.ffn=768"]
SIZE += ["model.vocab_size=8192", "model.context=2048"]


def sweep(folder: Path, backend: str = "torch") -> Path:
    """Run the documented sweep into `folder`."""
    lengths = ",".join(map(str, LENGTHS))
    command = [sys.executable, str(ROOT / "run.py"), "-m", "model=llama", *SIZE, "task=generate", "task.new_tokens=1",
               f"model.prompt_len={lengths}", f"backend={backend}", "tracking=none", "timing.max_time_s=3",
               f"hydra.sweep.dir={folder}"]  # fmt: skip
    subprocess.run(command, check=True, cwd=ROOT)
    return folder


def prefill_times(folder: Path) -> dict[int, np.ndarray]:
    """{prompt length: every sample's time to first token}, of the sweep's finished runs."""
    found = {}
    for result in folder.glob("*/result.json"):
        record = json.loads(result.read_text())
        if record.get("status") == "FINISHED":
            with h5py.File(result.parent / "tensors.h5") as f:
                found[int(record["config"]["model"]["prompt_len"])] = f["timings/token_latency_s"][:, 0]
    return dict(sorted(found.items()))


def exponent(lengths: np.ndarray, seconds: np.ndarray) -> tuple[float, float, float]:
    """k of seconds ~ length^k by least squares in logs, with its 95% interval."""
    fit = stats.linregress(np.log(lengths), np.log(seconds))
    half = stats.t.ppf(0.975, len(lengths) - 2) * fit.stderr
    return fit.slope, fit.slope - half, fit.slope + half


def table(times: dict[int, np.ndarray]) -> list[str]:
    lengths = np.array(list(times), float)
    medians = np.array([np.median(t) for t in times.values()])
    lines = ["| prompt tokens | TTFT (median) | samples | per prompt token | local exponent |", "|---|---|---|---|---|"]
    for i, (length, t) in enumerate(times.items()):
        local = "" if not i else f"{np.log(medians[i] / medians[i - 1]) / np.log(length / lengths[i - 1]):.2f}"
        lines.append(
            f"| {length} | {format_seconds(medians[i])} | {len(t)} | {format_seconds(medians[i] / length)} | {local} |"
        )
    lines.append("")
    for label, keep in (("every length", lengths > 0), ("128 and longer", lengths >= 128)):
        if keep.sum() >= 3:
            k, low, high = exponent(lengths[keep], medians[keep])
            lines.append(f"- time ~ length^k over {label}: k = {k:.2f} [{low:.2f}–{high:.2f}]")
    return lines


def main(argv: list[str]) -> None:
    folder = Path(argv[0]) if argv else sweep(ROOT / "outputs" / "prefill_scaling")
    print("\n".join(table(prefill_times(folder))))


if __name__ == "__main__":
    main(sys.argv[1:])

#!/usr/bin/env python
"""Markdown table of one experiment sweep, from its jobs' result.json files (for experiments/README.md).

.venv/bin/python experiments/summarize.py SWEEP_DIR
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from runner.report import markdown as markdown_table  # noqa: E402
from runner.timing import format_seconds  # noqa: E402

EXTRA = ("gflops_per_s", "shares_memory", "copied", "result_is_float64", "max_rel_err_vs_reference")


def rows(sweep_dir: Path) -> pd.DataFrame:
    records = []
    for path in sorted(sweep_dir.glob("*/result.json"), key=lambda p: int(p.parent.name)):
        result = json.loads(path.read_text())
        config, metrics = result["config"], result["metrics"]
        record = {
            "backend": config["backend"]["name"],
            "device": result["environment"].get("device", config["device"]["name"]),
            "model": config["model"]["name"],
            "mode": config["mode"]["name"],
            "size": config["model"].get("method") or "",
            "status": result["status"],
        }
        if config["model"]["name"] in ("sigmoid", "conversion"):
            record["size"] = f"{record['size']} {config['model']['size']}".strip()
        elif config["model"]["name"] in ("matmul", "reshape"):
            record["size"] = f"{record['size']} n={config['model']['n']}".strip()
        record.update({k: metrics.get(k) for k in ("time_median_s", "time_iqr_s", "first_call_s", *EXTRA)})
        records.append(record)
    return pd.DataFrame(records)


def markdown(frame: pd.DataFrame) -> str:
    varied = [c for c in ("backend", "device", "model", "mode", "size") if frame[c].nunique() > 1]
    fastest = frame["time_median_s"].min()
    out = pd.DataFrame({c: frame[c] for c in varied})
    out["median"] = frame["time_median_s"].map(_seconds)
    out["IQR"] = frame["time_iqr_s"].map(_seconds)
    out["first call"] = frame["first_call_s"].map(_seconds)
    out["x fastest"] = (frame["time_median_s"] / fastest).map(lambda v: f"{v:.2f}")
    for column in EXTRA:
        if frame[column].notna().any():
            out[column] = frame[column].map(lambda v: "" if pd.isna(v) else f"{v:.3g}")
    if (frame["status"] != "FINISHED").any():
        out["status"] = frame["status"]
    return markdown_table(out)


def _seconds(value) -> str:
    return "" if pd.isna(value) else format_seconds(float(value))


if __name__ == "__main__":
    print(markdown(rows(Path(sys.argv[1]))))

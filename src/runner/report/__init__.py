"""Compare runs: a table (CSV, markdown) and PNG plots, from a sweep directory or an MLflow experiment.

Rows are runs (runner.record.runs, loaded from directories or MLflow); columns follow `mlflow.search_runs`:
`params.<flattened config key>`, `metrics.<name>`, plus `status`, `error`, `run_dir`, the run's identity
(`work`, `configuration`, `case`, `machine`, `host`: runner.identity), its `setup`, `size` and `size_name` (in a
size sweep: the one numeric setting of the model or its inputs that varies, e.g. model.n of matmul) and the raw
timing samples (`samples_s`, and the round of each in `sample_rounds`, from each run's tensors.h5 where it is on
this machine). Each run is compared with the fastest run doing the same work (runner.report.comparison, the one
place a ratio against a baseline is computed): `time_ratio` with its 95% interval over the rounds, and a verdict.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from runner import tracking
from runner.report.frames import (
    COMPARISON,
    compare,
    frame,
    human_table,
    markdown,
    setup_notes,
    table,
    work_keys,
)
from runner.report.plots import (
    plot_speedup_vs_size,
    plot_speedups,
    plot_time_vs_size,
    plot_times,
    plot_token_latency,
)
from runner.report.sweep_answer import Answer, answer

__all__ = [
    "Answer",
    "COMPARISON",
    "answer",
    "compare",
    "human_table",
    "log_to_parent",
    "markdown",
    "frame",
    "setup_notes",
    "table",
    "work_keys",
    "write_report",
]


def write_report(frame: pd.DataFrame, out_dir: Path) -> list[Path]:
    """runs.csv, runs.md and the PNG plots that apply to these runs; returns the files written."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    if frame.empty:
        raise LookupError("no runs to report")
    written = [out_dir / "runs.csv", out_dir / "runs.md"]
    table(frame).to_csv(written[0], index=False)
    written[1].write_text(markdown(frame))
    plots = (
        plot_times(frame, out_dir / "time_per_config.png"),
        plot_time_vs_size(frame, out_dir / "time_vs_size.png"),
        plot_speedups(frame, out_dir / "speedup.png"),
        plot_speedup_vs_size(frame, out_dir / "speedup_vs_size.png"),
        plot_token_latency(frame, out_dir / "token_latency.png"),
    )
    return written + [p for p in plots if p is not None]


def log_to_parent(uri: str, parent_run_id: str, files: list[Path], artifact_path: str = "report") -> None:
    """Attach report files to a sweep's parent run."""
    tracking.log_files(uri, parent_run_id, files, artifact_path)

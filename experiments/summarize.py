#!/usr/bin/env python
"""Markdown table of one experiment sweep, from its jobs' result.json files (for experiments/README.md).

.venv/bin/python experiments/summarize.py SWEEP_DIR
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from runner import report  # noqa: E402
from runner.record import runs  # noqa: E402
from runner.record.table import SWEEP_COLUMNS, markdown  # noqa: E402


def summary(sweep_dir: Path) -> str:
    """The sweep's jobs as the markdown table its own end printed on the terminal."""
    return markdown(*report.human_table(report.frame(runs.from_dirs(runs.runs_in(sweep_dir))), SWEEP_COLUMNS))


if __name__ == "__main__":
    if len(sys.argv) != 2 or not runs.runs_in(Path(sys.argv[1])):
        print(f"usage: {sys.argv[0]} SWEEP_DIR (a sweep's folder, holding its jobs' result.json)", file=sys.stderr)
        sys.exit(2)
    print(summary(Path(sys.argv[1])))

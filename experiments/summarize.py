#!/usr/bin/env python
"""Markdown table of one experiment sweep, from its jobs' result.json files (for experiments/README.md).

.venv/bin/python experiments/summarize.py SWEEP_DIR
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from runner import report  # noqa: E402
from runner.record.table import SWEEP_COLUMNS, markdown  # noqa: E402

if __name__ == "__main__":
    frame = report.runs_from_dirs(report.sweep_run_dirs(Path(sys.argv[1])))
    print(markdown(*report.human_table(frame, SWEEP_COLUMNS)))

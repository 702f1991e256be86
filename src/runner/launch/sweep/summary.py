"""A sweep's closing output: the table on the terminal with the answer, what failed and the jobs' warnings once;
summary.md and the report in the sweep folder, read back from the jobs' records (runner.report)."""

from __future__ import annotations

import logging
import sys
import threading
from pathlib import Path
from typing import TYPE_CHECKING

from runner.config import first_line
from runner.launch.sweep import notes
from runner.launch.sweep_lines import grouped_warnings
from runner.launch.terminal import print_answer
from runner.record import naming
from runner.record.result import Status
from runner.record.sweep_file import read_sweep_file

if TYPE_CHECKING:
    import pandas as pd

log = logging.getLogger(__name__)


def import_report_meanwhile() -> None:
    """Once nothing is timed any more, import what the summary and the report need (pandas, matplotlib,
    scipy's t quantile: most of a second) while the workers write their records."""

    def load() -> None:
        from scipy.special import stdtrit  # noqa: F401

        from runner.report import plots

        plots._pyplot()

    threading.Thread(target=load, name="import-report", daemon=True).start()


# The answer's words explained, once: docs/sweeps.md's section "How to read this" (tests/test_pooled.py holds the two
# to one text), and how-to-read.md beside every sweep and on its parent run.
HOW_TO_READ = """\
A sweep's answer (the last lines in the terminal, the top of `summary.md` and of its parent run's description) reads
like this:

```text
numpy fastest (109 µs); torch 5.74x [4.11–8.02]; jax 180x [159–204]; the order is certain, the sizes known to ±40%
```

- **`torch 5.74x [4.11–8.02]`**: torch's time per call over the fastest configuration's (typical times: each turn's
  fastest block, the median over rounds, the seeds' geometric mean), and that ratio's 95% interval, for all of the
  sweep's comparisons together. The chart `report/speedup.png` draws the same figures.
- **`the sizes known to ±40%`**: how far the interval farthest from its ratio reaches (`only` where an interval spans
  more than 1.5x). A busy machine is in the intervals already: it makes the rounds disagree, which widens them; it is
  named among the warnings, not as the reason. `the order is certain`: every interval lies above 1 and no two overlap;
  `within noise: torch`: torch's interval holds 1. Where a comparison has no interval or a configuration's
  measurements disagree, no winner opens the answer: `no reliable order (why; what to set): numpy 19 µs; torch
  31 µs, unstable; jax 9.0x (cannot tell)`, an unstable configuration with its typical time and no ratio.
- **Verdicts**: `fastest`; `slower` or `faster` (the interval excludes 1); `within noise` (it holds 1);
  `cannot tell (why)` (no interval: one round, no samples, an unstable fastest); `unstable: why` (its rounds or seeds
  disagree too much for a verdict). Where a job's rounds spread (a busy machine) but every paired round, or enough
  of them for the sign test, puts it on one side: `slower (in 39 of 39 paired rounds, at least 1.68x; though ...)`,
  the bound from the rounds' order statistics, which no stall can bias. `cannot tell (not enough samples (2))`: fewer
  than 3 samples (or timed parts of a call; on a busy machine, 3 whole calls), listed after the order with its time,
  never ranked or drawn; where fewer than two have enough, the answer opens `not enough samples for an order`.
- **`resolves 20.0%`** (a job's resolution): the smallest difference its comparison would call 9 times in 10 at the
  spread it saw (from 100% on, the factor: `a 9.99x difference`). A sweep measures in rounds until every
  comparison resolves `timing.resolve` (default 0.1, 10%); `out of budget: a comparison resolves only 22.5% after
  11 rounds` says its budget ran out first: a longer `timing.max_time_s` narrows it.
- **`ratio from 9 rounds, 1 of 5 comparisons`**: a round is every job taking one turn; the ratio is the geometric
  mean of its 9 rounds' ratios. `1 of 5 comparisons`: the sweep compares 5 jobs with the fastest at once, so each
  interval is at 1 - 0.05 / 5 and the five together at 95%. `1 round`: measured apart, no interval; `cannot tell
  (the fastest took 1 round)`: this job took many rounds, but the fastest fit only one turn in its budget.
- **Warnings** (`busy machine while timing`, `noisy measurement`, `out of budget`): each once, with the jobs it
  concerns, under the terminal's table, in `summary.md` and in the parent run's description.
"""


def write_files(frame: pd.DataFrame, sweep_dir: Path) -> list[Path]:
    """The report and summary.md in the sweep folder (and each job's MLflow note); the files written."""
    from runner import report
    from runner.tracking import GUIDE

    files = []
    try:
        files = report.write_report(frame, sweep_dir / "report")
    except Exception as error:  # a plot that cannot be drawn must not hide the results
        log.warning(f"could not write the sweep's report ({first_line(error)})")
    summary = sweep_dir / "summary.md"
    answer = report.answer(frame)
    said = "".join(f"warning: {line}  \n" for line in sweep_warnings(frame, sweep_dir))  # as the terminal said
    summary.write_text(f"# Sweep summary\n\n{answer.markdown}\n" + (f"\n{said}\n" if said else "") + answer.details)
    guide = sweep_dir / GUIDE
    guide.write_text(f"# How to read this\n\n{HOW_TO_READ}")
    notes.note_comparisons(report.compare(frame))
    return [summary, guide, *files]


def sweep_warnings(frame: pd.DataFrame, sweep_dir: Path) -> list[str]:
    """What the terminal warns of the sweep under its table, each once: the rounds' (out of budget, kept in
    sweep.json), then the jobs' (a busy machine, a noisy measurement), each with the jobs it concerns; without the
    'warning: '."""
    return list(dict.fromkeys([*read_sweep_file(sweep_dir).get("warnings", []), *job_warnings(frame)]))


def job_warnings(frame: pd.DataFrame) -> list[str]:
    """The jobs' warnings, each once with the jobs it concerns (runner.launch.sweep_lines.grouped_warnings)."""
    if "warnings" not in frame:
        return []
    rows = frame[frame["warnings"].map(bool)]
    return grouped_warnings((_job(row), list(row["warnings"])) for _, row in rows.iterrows())


def print_table(frame: pd.DataFrame, sweep_dir: Path) -> None:
    """One row per job: what varied, status, the table's columns in human units; then what failed."""
    from rich.console import Console
    from rich.table import Table

    from runner import report
    from runner.record.table import SWEEP_COLUMNS

    headers, cells = report.human_table(frame, SWEEP_COLUMNS)
    table = Table(title=f"Sweep: {len(frame)} jobs in {sweep_dir}", title_justify="left")
    for header in headers:
        table.add_column(header, overflow="fold")
    for row in cells:
        row[1] = _status(row[1])
        table.add_row(*row)
    # Into a file or pipe: as wide as the table needs, so no heading is folded into pieces.
    console = Console() if sys.stdout.isatty() else Console(width=max(160, Console(width=1000).measure(table).maximum))
    console.print(table)
    for line in report.setup_notes(frame):
        console.print(f"[yellow]{line}[/]", highlight=False)
    print_answer(console, report.answer(frame))
    for _, row in frame[frame["status"] != Status.FINISHED].iterrows():
        console.print(f"[bold red]{row['status']}[/] job {_job(row)}: {row['error']}", highlight=False)
    for line in sweep_warnings(frame, sweep_dir):  # the lines summary.md and the parent's description repeat
        log.warning(line)
    _print_history(frame, sweep_dir)
    _print_link(console, sweep_dir)


def _print_history(frame, sweep_dir: Path) -> None:
    """A line for each case this sweep measured whose history on this machine steps up at this sweep's runs."""
    from runner.history.store import regressed_here

    uri = read_sweep_file(sweep_dir).get("uri")
    if not uri or "run_dir" not in frame:
        return
    try:
        for line in regressed_here(uri, [Path(d) for d in frame["run_dir"]]):
            log.warning(line)
    except Exception as error:  # the sweep's results stand without its history
        log.warning(f"could not read the history of the cases measured ({first_line(error)})")


def _print_link(console, sweep_dir: Path) -> None:
    """The parent run and how to open it in the MLflow UI."""
    info = read_sweep_file(sweep_dir)
    if info.get("parent_run_id"):
        from runner.launch.terminal import ui_lines

        console.print(f"MLflow parent run {info['parent_run_id']} ({naming.sweep_title(info)})", highlight=False)
        for line in ui_lines(info["uri"], info["parent_run_id"], runs_list=True):
            console.print(line.strip(), highlight=False, soft_wrap=True)


def _job(row) -> str:
    """A job's number (its directory under the sweep), as Hydra and the table's run names count it."""
    return Path(row["run_dir"]).name


def _status(status: str) -> str:
    colours: dict[str, str] = {Status.FINISHED: "green", Status.FAILED: "bold red"}
    return f"[{colours.get(status, 'yellow')}]{status}[/]"

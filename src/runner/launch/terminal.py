"""What a person sees in the terminal about one run: what ran, its numbers in human units, its warnings,
where its files are and how to open it in the MLflow UI."""

from __future__ import annotations

import sys
from pathlib import Path

from runner.record.naming import choice
from runner.record.result import Result
from runner.record.table import COLUMNS

LABEL_WIDTH = 1 + max(len(column.label) for column in COLUMNS)  # 'first-call compile': a value never runs into it


def print_summary(run_dir: Path, result: Result) -> None:
    """A few readable lines: what ran (from the record's config), how fast, how accurate, where the files are."""
    c = {key: choice(result.config, key) for key in ("backend", "model", "task", "mode", "device", "dtype")}
    device = result.environment.get("device", c["device"])
    print(f"{c['backend']} | {c['model']} | {c['task']} | {c['mode']} | {device} | {c['dtype']}: {result.status}")
    if result.error:
        print(f"error: {result.error}", file=sys.stderr)
    for column in COLUMNS:
        cell = column.cell(result.metrics)
        if cell:
            print(_line(column.label, cell))
    for warning in result.warnings:
        print(f"warning: {warning}", file=sys.stderr)
    print(f"  results in {run_dir}")
    for line in tracking_lines(run_dir):
        print(line)


def tracking_lines(run_dir: Path) -> list[str]:
    """Where the run is in MLflow: its id and how to open it in the UI (from tracking.json)."""
    from runner.tracking.link import read_link_or_empty

    link = read_link_or_empty(run_dir)
    if not link.get("run_id"):
        return []
    return [_line("MLflow run", link["run_id"]), *ui_lines(link["uri"], link["run_id"])]


def ui_lines(uri: str, run_id: str, runs_list: bool = False) -> list[str]:
    """How a person opens a run in the MLflow UI for the store at `uri`: the command that serves a local store
    and the run's page in its experiment's model-training view; with `runs_list`, the experiment's runs list
    with the runner's columns (tracking.RUNS_VIEW)."""
    from runner import tracking

    served = uri.startswith(("http://", "https://"))
    base = tracking.ui_base(uri)
    lines = [] if served else [_line("browse with", f"mlflow ui --backend-store-uri {uri} --port {tracking.UI_PORT}")]
    label = "open" if served else "then open"
    experiment = tracking.experiment_of(uri, run_id)
    if experiment is None:
        return [*lines, _line(label, f"{base}/#/runs/{run_id}")]
    runs = f"{base}/#/experiments/{experiment}/runs"
    lines.append(_line(label, f"{runs}/{run_id}?{tracking.MODEL_TRAINING}"))
    if runs_list:
        lines.append(_line("runs list", f"{runs}?{tracking.MODEL_TRAINING}&viewStateShareKey={tracking.RUNS_VIEW}"))
    return lines


def print_answer(console, answer) -> None:
    """A sweep's answer under its table of jobs (runner.report.sweep_answer.Answer): where replicates were pooled, a
    row per configuration; then the sentence, the last thing the terminal shows before the MLflow link, and what one
    call is."""
    from rich.table import Table

    from runner.report.sweep_answer import sentence, table_cells

    if len(answer.pooled) == len({p.workload for p in answer.pooled}):  # nothing compared: the job table says it
        return
    if any(p.runs > 1 for p in answer.pooled):  # else the rows would be the job table's again
        headers, cells = table_cells(answer.pooled)
        title = "Replicates pooled (seeds, nodes): each configuration against the fastest"
        table = Table(title=title, title_justify="left")
        for header in headers:
            table.add_column(header, overflow="fold")
        for row in cells:
            table.add_row(*(cell.replace("\u00a0", " ") for cell in row))
        console.print(table)
    console.print(f"[bold]{sentence(answer.pooled)}[/]", highlight=False)
    if answer.call:
        console.print(answer.call, highlight=False)


def _line(label: str, value: str) -> str:
    """A labelled line of the summary, its value in the column after the longest label."""
    return f"  {label:<{LABEL_WIDTH}}{value}"

"""`runner history --html DIR`: a static page per case and machine (its series with the intervals, the steps
shaded) and an index that lists the regressions first, newest first."""

from __future__ import annotations

import html
from datetime import UTC, datetime
from pathlib import Path

from runner.record.table import format_seconds
from runner.report.history import History, describe_number, describe_step
from runner.report.history_numbers import format_number
from runner.report.history_series import NUMBERS
from runner.report.steps import Label

SHADES = {
    Label.REGRESSION: "tab:red",
    Label.IMPROVEMENT: "tab:green",
    Label.SUSPICIOUS: "tab:orange",
    Label.BUSY: "tab:grey",
}
STYLE = "body{font-family:sans-serif;max-width:60em;margin:2em auto}td,th{padding:.2em .6em;text-align:left}"


def write(histories: list[History], out_dir: Path, ui: str | None = None) -> Path:
    """index.html and one page (with its PNG) per case and machine under `out_dir`; returns the index. `ui`: the
    MLflow UI's address where the runs came from a store, which each run's id links to."""
    out_dir.mkdir(parents=True, exist_ok=True)
    items = []
    for h in histories:
        name = page_name(h)
        _plot(h, out_dir / f"{name}.png")
        (out_dir / f"{name}.html").write_text(_case_page(h, f"{name}.png", ui))
        steps = "; ".join([*(describe_step(h, s) for s in h.steps), *_number_changes(h)]) or "no step"
        items.append(f'<li><a href="{name}.html">{html.escape(h.case_name)}</a> on {html.escape(h.machine_name)}: ')
        newest = h.entries[-1]
        runs = f"{len(h.entries)} run{'s' if len(h.entries) != 1 else ''}"
        now = f"now {format_seconds(newest.typical_s)} ({_when(newest.started)})"
        items[-1] += f"{runs}, {now}; {html.escape(steps)}</li>"
    index = out_dir / "index.html"
    body = f"<h1>History</h1><p>Cases with a regression first, the newest first.</p><ul>{''.join(items)}</ul>"
    index.write_text(_page("History", body))
    return index


def page_name(h: History) -> str:
    """The file name (without .html or .png) of a case's page on one kind of machine."""
    return f"{h.case}-{h.machine}"


def _page(title: str, body: str) -> str:
    return f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>" + (
        f"<style>{STYLE}</style></head><body>{body}</body></html>"
    )


def _run_cell(run_id: str, ui: str | None) -> str:
    """A run's id, linked to its page in the MLflow UI where the history came from a store (`ui`: its address)."""
    if not ui:
        return html.escape(run_id)
    return f"<a href='{html.escape(ui)}/#/runs/{html.escape(run_id)}'>{html.escape(run_id)}</a>"


def _number_changes(h: History) -> list[str]:
    """Each change of the case's numbers (its error against float64, its tokens), as `runner history` prints it."""
    return [describe_number(h, name, step) for name, steps in h.numbers.items() for step in steps]


def _case_page(h: History, image: str, ui: str | None = None) -> str:
    said = [*(describe_step(h, s) for s in h.steps), *_number_changes(h)]
    steps = "".join(f"<li>{html.escape(line)}</li>" for line in said) or "<li>no step</li>"
    numbers = [name for name in NUMBERS if any(name in e.numbers for e in h.entries)]
    rows = "".join(
        f"<tr><td>{i}</td><td>{_when(e.started)}</td><td>{format_seconds(e.typical_s)}</td>"
        + "".join(f"<td>{format_number(n, e.numbers[n]) if n in e.numbers else ''}</td>" for n in numbers)
        + f"<td>{html.escape(e.version)}</td><td>{html.escape(e.change)}</td><td>{_run_cell(e.run_id, ui)}</td></tr>"
        for i, e in enumerate(h.entries)
    )
    columns = ("#", "started", "typical", *(NUMBERS[n] for n in numbers), "version", "known change", "run")
    headers = "".join(f"<th>{html.escape(name)}</th>" for name in columns)
    table = f"<table><tr>{headers}</tr>{rows}</table>"
    body = f"<p><a href='index.html'>all cases</a></p><h1>{html.escape(h.case_name)}</h1>"
    body += f"<p>on {html.escape(h.machine_name)}</p><ul>{steps}</ul><img src='{image}' alt='the series'>{table}"
    return _page(h.case_name, body)


def _when(epoch_s: float) -> str:
    return datetime.fromtimestamp(epoch_s, UTC).strftime("%Y-%m-%d %H:%M")


def _plot(h: History, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    points = [e.point() for e in h.entries]
    x = np.arange(len(points))
    typical = np.array([p.typical_s for p in points])
    errors = [typical - [p.low_s for p in points], [p.high_s for p in points] - typical]
    fig, ax = plt.subplots(figsize=(9, 4))
    ax.errorbar(x, typical * 1e6, yerr=np.array(errors) * 1e6, fmt="o", capsize=3, color="tab:blue")
    for step in h.steps:
        end = min((s.index for s in h.steps if s.index > step.index), default=len(points))
        ax.axvspan(step.index - 0.5, end - 0.5, color=SHADES.get(step.label, "lightgrey"), alpha=0.15)
        ax.axvline(step.index - 0.5, color=SHADES.get(step.label, "grey"), linestyle="--")
    for i, e in enumerate(h.entries):
        if e.change:
            ax.annotate(e.change, (i, typical[i] * 1e6), rotation=90, fontsize=8, va="bottom")
    ax.set_xlabel("run, in time order (bars: the 95% interval of runs made apart)")
    ax.set_ylabel("typical time per call (µs)")
    ax.set_title(f"{h.case_name}\non {h.machine_name}", loc="left", fontsize=9)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)

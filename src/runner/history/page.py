"""`runner history --html DIR`: a static page per case and machine (its series with the intervals, the steps
shaded, a legend; what decided them: the control it was fitted against, the runs measured on a busy machine) and
an index that lists the cases with a regression first, then the others, each group newest first. A page carries its
plot; the copy --record logs to MLflow, which shows it in a sandboxed frame that opens no link, links nothing."""

from __future__ import annotations

import base64
import html
import shutil
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

from runner.history.describe import (
    control_notes,
    describe_figure,
    describe_number,
    describe_step,
    quiet_series,
    run_said,
)
from runner.history.figures import FIGURES, format_figure
from runner.history.gaps import Gapped
from runner.history.numbers import format_number
from runner.history.profiles import Reader, step_diff
from runner.history.series import NUMBERS, Entry, History
from runner.history.steps import Label
from runner.measure.machine_load import BUSY_OTHER_RUNNABLE, was_busy
from runner.record.table import format_seconds
from runner.tracking.store import MODEL_TRAINING

if TYPE_CHECKING:
    from matplotlib.figure import Figure

SHADES = {
    Label.REGRESSION: "tab:red",
    Label.IMPROVEMENT: "tab:green",
    Label.SUSPICIOUS: "tab:orange",
    Label.BUSY: "tab:grey",
}
STYLE = (
    "body{font-family:sans-serif;max-width:60em;margin:2em auto}td,th{padding:.2em .6em;text-align:left}"
    "td.when,td.host{white-space:nowrap}"  # a narrow column broke 'ci-runner-1' at its hyphens, over three lines
)


def write(
    histories: list[History],
    out_dir: Path,
    ui: str | None = None,
    gapped: Sequence[Gapped] = (),
    profiles: Reader | None = None,
    viewer: Path | None = None,
) -> Path:
    """index.html and one page (with its PNG) per case and machine under `out_dir`; returns the index. `ui`: the
    MLflow UI's address where the runs came from a store, which each run's id links to; `gapped`: the cases whose
    newest runs failed or that stopped appearing, listed first; `profiles`: each run's profile (history.profiles),
    where a step's page says where its time went; `viewer`: a folder where each page (and its PNG) is also written
    as --record logs it for MLflow's artifact viewer (no link: the viewer opens none, a click blanks the page)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    items = []
    for h in sorted(histories, key=_index_order):
        name = page_name(h)
        _plot(h, out_dir / f"{name}.png")
        image = "data:image/png;base64," + base64.b64encode((out_dir / f"{name}.png").read_bytes()).decode()
        diffs = _profile_diffs(h, profiles) if profiles else ""
        (out_dir / f"{name}.html").write_text(_case_page(h, image, diffs, ui))
        if viewer is not None:
            viewer.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(out_dir / f"{name}.png", viewer / f"{name}.png")
            (viewer / f"{name}.html").write_text(_case_page(h, image, diffs, ui, in_viewer=True))
        steps = "; ".join([*(describe_step(h, s) for s in h.steps), *_number_changes(h)]) or "no step"
        items.append(f'<li><a href="{name}.html">{html.escape(h.case_name)}</a> on {html.escape(h.machine_name)}: ')
        newest = h.entries[-1]
        runs = f"{len(h.entries)} run{'s' if len(h.entries) != 1 else ''}"
        now = f"now {format_seconds(newest.typical_s)} ({_when(newest.started)})"
        items[-1] += f"{runs}, {now}; {html.escape(_fit_said(h))}; {html.escape(steps)}</li>"
    index = out_dir / "index.html"
    body = "<h1>History</h1>"
    if gapped:
        lines = "".join(f"<li>{html.escape(g.line())}</li>" for g in gapped)
        body += f"<h2>Failing, missing or stopped</h2><ul>{lines}</ul><h2>Series</h2>"
    body += "<p>Cases with a regression first, then the others; each the newest first.</p>"
    body += f"<ul>{''.join(items)}</ul>"
    index.write_text(_page("History", body))
    return index


def _fit_said(h: History) -> str:
    """What decided a case's steps, as its line on the index says it: 'the control of the others', 'fitted relative
    to its control NAME' or 'fitted on its times', how many of its runs were measured on a busy machine, and each
    sweep whose control gave no time (describe.control_notes)."""
    said = "the control of the others" if h.is_control else "fitted on its times"
    said = f"fitted relative to its control {h.control_name}" if h.relative else said
    busy = sum(_busy(e) for e in h.entries)
    said += f", {busy} of {len(h.entries)} runs on a busy machine" if busy else ""
    return "; ".join([said, *control_notes(h)])


def _index_order(h: History) -> tuple[bool, float]:
    return not any(s.label == Label.REGRESSION for s in h.steps), -h.entries[-1].started


def page_name(h: History) -> str:
    """The file name (without .html or .png) of a case's page on one kind of machine."""
    return f"{h.case}-{h.machine}"


def _page(title: str, body: str) -> str:
    return f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>" + (
        f"<style>{STYLE}</style></head><body>{body}</body></html>"
    )


def _run_cell(entry: Entry, ui: str | None) -> str:
    """A run's id, linked to its page in the MLflow UI where the history came from a store (`ui`: the tracking
    server's address), in its experiment's model-training view."""
    run_id = entry.run_id
    if not ui:
        return html.escape(run_id)
    where = (
        f"#/experiments/{entry.experiment_id}/runs/{run_id}?{MODEL_TRAINING}"
        if entry.experiment_id
        else f"#/runs/{run_id}"
    )
    return f"<a href='{html.escape(ui)}/{html.escape(where)}'>{html.escape(run_id)}</a>"


def _number_changes(h: History) -> list[str]:
    """Each change of the case's numbers (its error against float64, its tokens) and each step of its figures (the
    first call and its parts, load, memory, a generation's), as `runner history` prints it."""
    numbers = [describe_number(h, name, step) for name, steps in h.numbers.items() for step in steps]
    return numbers + [describe_figure(h, name, step) for name, steps in h.figures.items() for step in steps]


def _case_page(h: History, image: str, diffs: str, ui: str | None, in_viewer: bool = False) -> str:
    """A case's page: `image` its plot's address (a data: URL, so that it shows wherever the page is opened),
    `diffs` where its steps' time went; `in_viewer`: the copy for MLflow's artifact viewer, which opens no link: each
    run's id in words, and where a run opens and where the other cases' pages are said instead."""
    said = [*(describe_step(h, s) for s in h.steps), *_number_changes(h), *quiet_series(h)]
    steps = "".join(f"<li>{html.escape(line)}</li>" for line in said) or "<li>no step</li>"
    numbers = [name for name in NUMBERS if name in h.numbers]
    figures = list(h.figures)  # each figure some run recorded (of those --series named), a column
    hosts = h.several_hosts()
    rows = "".join(
        f"<tr><td>{i}</td><td class='when'>{_when(e.started)}</td>"
        + (f"<td class='host'>{html.escape(e.host)}</td>" if hosts else "")
        + f"<td>{format_seconds(e.typical_s)}</td>"
        + "".join(f"<td>{format_number(n, e.numbers[n]) if n in e.numbers else ''}</td>" for n in numbers)
        + "".join(f"<td>{format_figure(n, e.figures[n]) if n in e.figures else ''}</td>" for n in figures)
        + f"<td>{'busy' if _busy(e) else ''}</td>"
        + f"<td>{html.escape(e.version)}</td><td>{html.escape(e.change)}</td>"
        + f"<td>{_run_cell(e, None if in_viewer else ui)}</td></tr>"
        for i, e in enumerate(h.entries)
    )
    named = (*(NUMBERS[n] for n in numbers), *(FIGURES[n].said for n in figures))
    where = ("host",) if hosts else ()
    columns = ("#", "started", *where, "typical", *named, "machine", "version", "known change", "run")
    headers = "".join(f"<th>{html.escape(name)}</th>" for name in columns)
    table = f"<table><tr>{headers}</tr>{rows}</table>"
    top = f"<p>{html.escape(_viewer_note(h, ui))}</p>" if in_viewer else "<p><a href='index.html'>all cases</a></p>"
    body = f"{top}<h1>{html.escape(h.case_name)}</h1>"
    body += f"<p>on {html.escape(h.machine_name)}</p><p>{html.escape(decided_by(h))}</p><ul>{steps}</ul>"
    body += f"<img src='{image}' alt='the series'>{table}"
    return _page(h.case_name, body + diffs)


def _viewer_note(h: History, ui: str | None) -> str:
    """Where the copy in MLflow's artifact viewer says a run opens, and the other cases' pages are."""
    experiment = h.entries[-1].experiment_id
    where = f"#/experiments/{experiment}/runs/RUN_ID?{MODEL_TRAINING}" if experiment else "#/runs/RUN_ID"
    runs = f"; a run opens at {ui}/{where}" if ui else ""
    return (
        f"Logged by runner history --record for MLflow's artifact viewer, which opens no link{runs}; each case's "
        "page is among its own newest run's artifacts (history/), and runner history --html DIR writes them all, "
        "with their index."
    )


def _profile_diffs(h: History, read: Reader) -> str:
    """Per step in time whose either side has a profiled run: the functions whose self time per call moved most
    between them, largest move first."""
    out = ""
    for step in h.steps:
        diff = step_diff(h, step, read)
        if diff is None:
            continue
        rows = "".join(
            f"<tr><td>{html.escape(m.function)}</td><td>{format_seconds(m.before_s)}</td>"
            f"<td>{format_seconds(m.after_s)}</td><td>{'+' if m.moved_s > 0 else '−'}{format_seconds(abs(m.moved_s))}"
            "</td></tr>"
            for m in diff.moves
        )
        out += f"<h2>Where the time went: {html.escape(describe_step(h, step))}</h2>"
        out += (
            f"<p>{html.escape(diff.profiler)} of run {html.escape(run_said(diff.before.run_id))} (before) and run "
            f"{html.escape(run_said(diff.after.run_id))} (after), self time per call, the largest move first</p>"
        )
        out += f"<table><tr><th>function</th><th>before</th><th>after</th><th>moved</th></tr>{rows}</table>"
    return out


def decided_by(h: History) -> str:
    """What the steps were found in, in words: the times themselves or the ratio to the control, the runs measured
    on a busy machine, and each sweep whose control gave no time (describe.control_notes)."""
    if h.is_control:
        said = "This case is the control of other cases: its steps are the whole machine's, and no gate fails on them."
    elif h.relative:
        said = (
            f"Fitted relative to the control {h.control_name}: each run's time over the control's, measured in the "
            "same rounds, so the machine's drift between sweeps cancels (the plot shows that ratio)."
        )
    elif control_notes(h):
        said = "Fitted on the typical times themselves."
    else:
        said = "Fitted on the typical times themselves (no control was timed beside every run)."
    busy = sum(_busy(e) for e in h.entries)
    if busy:
        said += (
            f" {busy} of {len(h.entries)} runs were measured on a busy machine (over {BUSY_OTHER_RUNNABLE:g} other "
            "runnable threads): a step load alone could make beside them is labelled busy machine and fails no gate."
        )
    return " ".join([said, *(f"{note[0].upper()}{note[1:]}." for note in control_notes(h))])


def _busy(entry: Entry) -> bool:
    return was_busy(entry.busy)


def _when(epoch_s: float) -> str:
    return datetime.fromtimestamp(epoch_s, UTC).strftime("%Y-%m-%d %H:%M")


def _plot(h: History, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig = figure(h)
    fig.savefig(path, dpi=100)
    plt.close(fig)


def figure(h: History) -> Figure:
    """A case's plot: each run's point and interval in time order, the steps shaded, the known changes named; fitted
    relative to its control, a run whose control gave no time has no ratio, and a dotted line holds its place."""
    import matplotlib.pyplot as plt
    import numpy as np
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    points = [e.point(relative=h.relative) for e in h.entries]
    scale = 1.0 if h.relative else 1e6  # a ratio to the control, or microseconds
    x = np.arange(len(points))
    typical = np.array([p.typical_s for p in points])
    errors = np.array([typical - [p.low_s for p in points], [p.high_s for p in points] - typical]) * scale
    busy = np.array([_busy(e) for e in h.entries])
    fig, ax = plt.subplots(figsize=(9, 4))
    quiet = ax.errorbar(x[~busy], typical[~busy] * scale, yerr=errors[:, ~busy], fmt="o", capsize=3, color="tab:blue")
    handles: list[tuple[object, str]] = [(quiet, "a run (bar: its 95% interval)")]
    if busy.any():
        loaded = ax.errorbar(x[busy], typical[busy] * scale, yerr=errors[:, busy], fmt="o", capsize=3,
                             mfc="white", color="tab:blue")  # fmt: skip
        handles.append((loaded, "a run on a busy machine"))
    for label in dict.fromkeys(s.label for s in h.steps):
        handles.append((Patch(color=SHADES.get(label, "lightgrey"), alpha=0.3), f"after a step: {label}"))
    for step in h.steps:
        end = min((s.index for s in h.steps if s.index > step.index), default=len(points))
        ax.axvspan(step.index - 0.5, end - 0.5, color=SHADES.get(step.label, "lightgrey"), alpha=0.15)
        ax.axvline(step.index - 0.5, color=SHADES.get(step.label, "grey"), linestyle="--")
    lost = [i for i, e in enumerate(h.entries) if h.relative and e.control_lost]
    for i in lost:
        ax.axvline(i, color="grey", linestyle=":")
    if lost:
        handles.append((Line2D([], [], color="grey", linestyle=":"), "its control gave no time: no ratio"))
    for i, e in enumerate(h.entries):
        if e.change:
            ax.annotate(e.change, (i, typical[i] * scale), rotation=90, fontsize=8, va="bottom")
    bars = "a ratio measured in the same rounds" if h.relative else "runs made apart"
    ax.set_xlabel(f"run, in time order (bars: the 95% interval of {bars})")
    ax.set_ylabel("time / the control's time" if h.relative else "typical time per call (µs)")
    ax.legend(*zip(*handles, strict=True), fontsize=8, loc="best")
    fit = f"\nrelative to the control {h.control_name}" if h.relative else ""
    fit = "\nthe control of other cases: the machine's own series" if h.is_control else fit
    ax.set_title(f"{h.case_name}\non {h.machine_name}{fit}", loc="left", fontsize=9)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig

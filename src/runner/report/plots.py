"""The report's PNG plots: one panel per workload, labelled by what varied."""

from __future__ import annotations

import math
from collections.abc import Iterable
from pathlib import Path

import numpy as np
import pandas as pd

from runner.record.naming import READ_BY_TASKS
from runner.record.table import format_seconds
from runner.report.frames import (
    PANEL_KEYS,
    SETTINGS,
    numeric_settings,
    param_cell,
    short_name,
    timed_runs,
    varied_params,
    work_keys,
)

MAX_SIZE_TICKS = 8
SPEEDUP_LOG_ABOVE = 10  # a speedup axis spanning more than this factor is drawn on a log scale
SERIES_KEYS = ("params.backend.name", "params.mode.name", "params.device.name", "params.dtype")


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def workloads(frame: pd.DataFrame, keys: Iterable[str] | None = None) -> list[tuple[str, pd.DataFrame]]:
    """The runs grouped by the work they did (work_keys unless other keys are given), each with a title
    that names the settings which differ between the groups."""
    keys = [k for k in (work_keys(frame) if keys is None else keys) if k in frame]
    if not keys:
        return [("all runs", frame)]
    numeric = numeric_settings(frame)
    varying = [k for k in keys if k in numeric and frame[k].dropna().nunique() > 1]
    groups = frame.groupby([frame[k].map(str) for k in keys], sort=True)
    return [(_workload_title(group.iloc[0], varying), group) for _, group in groups]


def _workload_title(row: pd.Series, settings: list[str]) -> str:
    """'mlp gradients, batch 32'; a task names the groups it reads: 'mlp train_step (adam), batch 32'."""
    title = f"{row.get('params.model.name', '?')} {row.get('params.task.name', '')}".strip()
    read = [row.get(f"params.{group}.name") for group in READ_BY_TASKS]  # held only where the task reads it
    read = [str(value) for value in read if isinstance(value, str) and value]
    if read:
        title += f" ({', '.join(read)})"
    if pd.notna(row.get("params.batch_size")):
        title += f", batch {int(row['params.batch_size'])}"
    for key in settings:
        if pd.notna(row.get(key)):
            title += f", {short_name(key)} {param_cell(row[key])}"
    return title


def _panel_labels(rows: pd.DataFrame) -> pd.Series:
    """Per run, what varied among these comparable runs, wrapped to stay narrow; its name otherwise."""
    import textwrap

    columns = varied_params(rows) if len(rows) > 1 else []
    if not columns:
        return rows["run"].map(lambda name: textwrap.fill(str(name), 34))

    def label(row: pd.Series) -> str:
        return textwrap.fill(" ".join(f"{short_name(c)}={param_cell(v)}" for c, v in row.items()), 34)

    labelled = rows[columns].apply(label, axis=1)
    same = labelled.duplicated(keep=False)  # e.g. a single run and a sweep's job with the same settings
    return labelled.where(~same, labelled + "\n" + rows["run"].map(str))


def _panels(plt, groups: list, rows_per_group: list[int]):
    """One horizontal panel per workload, each as tall as its runs need."""
    heights = [1.0 + 0.5 * n for n in rows_per_group]
    fig, axes = plt.subplots(
        len(groups), 1, figsize=(9, sum(heights) + 0.6), squeeze=False, gridspec_kw={"height_ratios": heights}
    )
    return fig, axes[:, 0]


def plot_times(frame: pd.DataFrame, path: Path) -> Path | None:
    """Time per call of each run (a box of its raw samples; median and IQR where they are not here), one panel per
    workload; speedup.png compares the configurations, seeds pooled."""
    if timed_runs(frame).empty:
        return None
    groups = workloads(timed_runs(frame), PANEL_KEYS)
    plt = _pyplot()
    fig, axes = _panels(plt, groups, [len(g) for _, g in groups])
    for ax, (title, group) in zip(axes, groups, strict=True):
        _time_panel(ax, group, title)
    axes[-1].set_xlabel(
        "time per call (box: median and IQR of all the run's samples; diamond: its typical time, each turn's fastest "
        "block, the median over rounds; log scale)"
    )
    fig.suptitle("Time per call of each run, the lowest typical time at the top of each panel")
    return _save(fig, path)


TYPICAL_MARK = "typical (what time / fastest compares)"


def _typical_times(group: pd.DataFrame) -> pd.Series:
    """Each run's typical time, as its comparison takes it (runner.report.timings.Timings; the median where its
    samples are not on this machine): what the tables' ratios and speedup.png compare, which a busy machine can set
    far from the median of all its samples (a box's middle line)."""
    from runner.report.frames import timings

    return pd.Series([timings(group.loc[[i]]).typical_s() for i in group.index], index=group.index, dtype=float)


def _time_panel(ax, group: pd.DataFrame, title: str) -> None:
    """A box of each run's samples, its typical time marked on it, in the order of the typical times (the answer's)."""
    typical = _typical_times(group).sort_values(kind="stable")
    group = group.loc[typical.index]
    for pos, (_, row) in enumerate(group.iterrows()):
        samples = row["samples_s"]
        if samples is not None and len(samples):
            ax.boxplot([samples], positions=[pos], orientation="horizontal", widths=0.6, showfliers=True)
        else:
            half = row.get("metrics.time_iqr_s", 0) / 2
            ax.errorbar(row["metrics.time_median_s"], pos, xerr=half, fmt="o", capsize=4)
    ax.plot(typical.to_numpy(), range(len(group)), "D", color="tab:red", markersize=6, zorder=3, label=TYPICAL_MARK)
    ax.legend(loc="best", fontsize=8)
    ax.set_yticks(range(len(group)), _panel_labels(group))
    ax.set_ylim(len(group) - 0.5, -0.5)
    _seconds_axis(ax.xaxis)
    _log_ticks(ax.xaxis)
    ax.set_title(title, loc="left", fontsize=10)
    ax.grid(axis="x", which="both", alpha=0.3)


def series_labels(frame: pd.DataFrame) -> pd.Series:
    """One line per configuration in a size plot: backend / mode / device / dtype and named alternatives
    (model.method, model.arch), those that differ among these runs."""
    numeric = numeric_settings(frame)
    named = [k for k in frame if str(k).startswith(SETTINGS) and k not in numeric and k not in PANEL_KEYS]
    keys = [k for k in (*SERIES_KEYS, *named) if k in frame and frame[k].map(str).nunique() > 1]
    keys = keys or [k for k in SERIES_KEYS[:2] if k in frame]
    return frame[keys].map(str).agg(" / ".join, axis=1)


def _size_axis(ax, sizes: pd.Series) -> None:
    """A log axis ticked at the sizes that were run (1, 32, 1,024, ...), not at powers of ten; matplotlib's
    own ticks where there are too many sizes to label each."""
    from matplotlib.ticker import NullFormatter

    ax.set_xscale("log")
    ticks = sorted(sizes.dropna().unique())
    if len(ticks) > MAX_SIZE_TICKS:
        return
    ax.set_xticks(ticks, [f"{t:,.0f}" if float(t).is_integer() else f"{t:g}" for t in ticks])
    ax.xaxis.set_minor_formatter(NullFormatter())


def _size_groups(frame: pd.DataFrame) -> list[tuple[str, pd.DataFrame]]:
    """Size sweeps: runs of one model, task and batch size at two or more sizes."""
    sized = timed_runs(frame)[timed_runs(frame)["size"].notna()]
    groups = workloads(sized, PANEL_KEYS)
    return [(title, g) for title, g in groups if g["size"].nunique() >= 2]


def plot_time_vs_size(frame: pd.DataFrame, path: Path) -> Path | None:
    """Seed 003's figure: time against size, log-log, one line per backend/mode, a panel per workload."""
    groups = _size_groups(frame)
    if not groups:
        return None
    plt = _pyplot()
    fig, axes = plt.subplots(len(groups), 1, figsize=(8, 5 * len(groups)), squeeze=False)
    for ax, (title, timed) in zip(axes[:, 0], groups, strict=True):
        for name, series in timed.groupby(series_labels(timed)):
            series = series.sort_values("size")
            iqr = series.get("metrics.time_iqr_s", pd.Series(0, index=series.index)) / 2
            ax.errorbar(series["size"], series["metrics.time_median_s"], yerr=iqr, marker="o", capsize=3, label=name)
        _size_axis(ax, timed["size"])
        _seconds_axis(ax.yaxis)
        _log_ticks(ax.yaxis)
        ax.set_xlabel(_size_label(timed))
        ax.set_ylabel("time per call (median, IQR bars)")
        ax.set_title(f"{title}: time against size", loc="left", fontsize=10)
        ax.grid(which="both", alpha=0.3)
        ax.legend()
    return _save(fig, path)


def plot_speedups(frame: pd.DataFrame, path: Path) -> Path | None:
    """Each configuration's time / the fastest's doing the same work, as every table gives it: replicates (runs
    that differ only in seed) pooled, the 95% intervals drawn, a log axis; a panel per workload (size sweeps
    have speedup_vs_size instead)."""
    in_size_sweeps = {i for _, g in _size_groups(frame) for i in g.index}
    timed = timed_runs(frame).drop(index=list(in_size_sweeps))
    panels = [(_titled(t, found), found) for t, g in workloads(timed) for found in _pooled(g) if len(found) >= 2]
    if not panels:
        return None
    plt = _pyplot()
    fig, axes = _panels(plt, panels, [len(found) for _, found in panels])
    for ax, (title, found) in zip(axes, panels, strict=True):
        _ratio_panel(ax, found, title)
    axes[-1].set_xlabel("time / the fastest doing the same work (log scale; lines: 95% interval; seeds pooled)")
    fig.suptitle("Time relative to the fastest configuration, fastest at the top")
    return _save(fig, path)


def _titled(title: str, found: list) -> str:
    return f"{title} · {found[0].workload}" if found[0].workload else title  # a setup, where there are several


def _pooled(group: pd.DataFrame) -> list[list]:
    """The pooled configurations of one workload's runs, a list per setup (runner.report.pooled)."""
    from runner.report.pooled import pool

    found = pool(group)
    return [[p for p in found if p.workload == w] for w in dict.fromkeys(p.workload for p in found)]


def _ratio_panel(ax, found: list, title: str) -> None:
    import numpy as np
    from matplotlib.ticker import FuncFormatter

    from runner.report.sweep_answer import _ratio_said, interval_text

    ratios = np.array([p.ratio if p.comparison.ranked else np.nan for p in found])  # too few samples: no bar
    lows = np.array([p.ratio - p.low for p in found])  # NaN where there is no interval: no line drawn
    highs = np.array([p.high - p.ratio for p in found])
    ax.barh(range(len(found)), ratios - 1, left=1, xerr=[lows, highs], capsize=4, color="tab:blue", alpha=0.7)
    for pos, p in enumerate(found):
        if not p.comparison.ranked:
            text = f"{format_seconds(p.time_s)}, {p.reason}"
        elif pos == 0:
            text = f"fastest, {format_seconds(p.time_s)}"
        else:
            text = f"{_ratio_said(p)} {interval_text(p)}".strip()  # '0.17x a token' where it is of a token's time
        text += f" ({p.verdict})" if p.verdict in ("unstable", "cannot tell") and p.comparison.ranked else ""
        ax.annotate(
            text,
            (max(p.ratio, p.high if p.high == p.high else 0) if p.comparison.ranked else 1, pos),
            xytext=(6, 0),
            textcoords="offset points",
            va="center",
            fontsize=9,
        )
    ax.set_xscale("log")
    ax.set_xlim(0.8, np.nanmax([*ratios, *(ratios + highs)]) * 4)  # room for the labels
    ax.xaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}x"))
    _log_ticks(ax.xaxis)
    ax.set_yticks(range(len(found)), [f"{p.label} ({p.runs} runs)" if p.runs > 1 else p.label for p in found])
    ax.set_ylim(len(found) - 0.5, -0.5)
    ax.axvline(1, color="black", linewidth=0.8)
    ax.set_title(title, loc="left", fontsize=10)
    ax.grid(axis="x", which="both", alpha=0.3)


def plot_speedup_vs_size(frame: pd.DataFrame, path: Path) -> Path | None:
    """Size sweeps comparing two or more backends/modes: time / the fastest at each size, against size."""
    groups = [(t, g) for t, g in _size_groups(frame) if series_labels(g).nunique() >= 2]
    if not groups:
        return None
    plt = _pyplot()
    fig, axes = plt.subplots(len(groups), 1, figsize=(8, 5 * len(groups)), squeeze=False)
    for ax, (title, timed) in zip(axes[:, 0], groups, strict=True):
        ratios = _ratios_by_size(timed.assign(series=series_labels(timed)))
        for name in ratios.columns:
            ax.plot(ratios.index, ratios[name], marker="o", label=name)
        _size_axis(ax, timed["size"])
        ax.set_xlabel(_size_label(timed))
        spans_decades = ratios.max().max() / ratios.min().min() > SPEEDUP_LOG_ABOVE
        if spans_decades:  # 870x and 1.9x on one linear axis: the small ones sit on the floor
            ax.set_yscale("log")
        ax.set_ylabel("time / the fastest at that size" + (" (log scale)" if spans_decades else ""))
        ax.set_title(f"{title}: time relative to the fastest, against size", loc="left", fontsize=10)
        ax.grid(which="both", alpha=0.3)
        ax.legend()
    return _save(fig, path)


def _ratios_by_size(timed: pd.DataFrame) -> pd.DataFrame:
    """Each series' time / the fastest's at each size (rows: sizes, columns: series), as the tables compare them
    (runner.report.comparison, replicates pooled)."""
    from runner.report.comparison import versus_fastest
    from runner.report.frames import timings

    ratios: dict[str, dict[float, float]] = {}
    for size, at_size in timed.groupby("size"):
        series = [(name, runs) for name, runs in at_size.groupby("series", sort=True)]
        found = versus_fastest([timings(runs) for _, runs in series], [name for name, _ in series])
        for (name, _), c in zip(series, found, strict=True):
            ratios.setdefault(name, {})[size] = c.ratio
    return pd.DataFrame(ratios).sort_index()


def plot_token_latency(frame: pd.DataFrame, path: Path) -> Path | None:
    """task=generate: each run's time per token against the token's position (the median over its samples; the
    first token is the prefill's), one panel per workload; None where no run on this machine recorded them."""
    from runner.record.result import read_timings

    timed = timed_runs(frame)
    read = {i: read_timings(Path(d), "token_latency_s") for i, d in timed.get("run_dir", pd.Series()).items()}
    rows = {i: r for i, r in read.items() if r is not None and r.ndim == 2 and not np.isnan(r).all()}
    if not rows:
        return None
    from matplotlib.ticker import FuncFormatter, MaxNLocator

    groups = workloads(timed.loc[list(rows)], PANEL_KEYS)
    plt = _pyplot()
    fig, axes = plt.subplots(len(groups), 1, figsize=(9, 3.5 * len(groups)), squeeze=False)
    for ax, (title, group) in zip(axes[:, 0], groups, strict=True):
        for (i, _), label in zip(group.iterrows(), _panel_labels(group), strict=True):
            ax.plot(np.arange(1, rows[i].shape[1] + 1), np.nanmedian(rows[i], axis=0), marker=".", label=label)
        ax.yaxis.set_major_formatter(FuncFormatter(lambda value, _: format_seconds(value)))
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_ylim(bottom=0)
        ax.set_title(title, loc="left", fontsize=10)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1))
    axes[-1, 0].set_xlabel("new token (1: the first, after the prompt's prefill)")
    fig.suptitle("Time to each new token (median over the samples)")
    return _save(fig, path)


def _size_label(timed: pd.DataFrame) -> str:
    return f"{timed['size_name'].iloc[0]} (log scale)"


def _seconds_axis(axis) -> None:
    """A log axis of seconds labelled '10 µs', '1 ms', ..."""
    from matplotlib.ticker import FuncFormatter, NullFormatter

    axis.axes.set_xscale("log") if axis is axis.axes.xaxis else axis.axes.set_yscale("log")
    axis.set_major_formatter(FuncFormatter(lambda value, _: format_seconds(value)))
    axis.set_minor_formatter(NullFormatter())


LOG_TICKS = ((30, tuple(range(1, 10))), (3e3, (1, 2, 5)), (1e5, (1, 3)))  # an axis spanning up to: ticks at


def _log_ticks(axis) -> None:
    """Labelled ticks on a log axis near every value, however few decades it spans: at 1-9 of each decade over
    up to 30x, 1, 2 and 5 over up to 3,000x, 1 and 3 over up to 1e5x, the decades beyond (matplotlib's own leave an
    axis from 20 to 60 µs without a label). Call it once the data is drawn and the limits set."""
    from matplotlib.ticker import LogLocator, NullFormatter

    low, high = sorted(axis.get_view_interval())
    span = high / low if low > 0 else math.inf
    subs = next((subs for most, subs in LOG_TICKS if span <= most), (1,))
    axis.set_major_locator(LogLocator(base=10, subs=subs, numticks=50))
    axis.set_minor_locator(LogLocator(base=10, subs=tuple(range(1, 10)), numticks=50))
    axis.set_minor_formatter(NullFormatter())


def _save(fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110, bbox_inches="tight")  # long labels widen the image instead of being cut
    import matplotlib.pyplot as plt

    plt.close(fig)
    return path

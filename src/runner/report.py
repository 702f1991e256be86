"""Compare runs: a table (CSV, markdown) and PNG plots, from a sweep directory or an MLflow experiment.

Rows are runs; columns follow `mlflow.search_runs`: `params.<flattened config key>`, `metrics.<name>`,
plus `status`, `error`, `run_dir`, `size` and `size_name` (in a size sweep: the one numeric setting of
the model or its inputs that varies, e.g. model.n of matmul) and the raw timing samples (`samples_s`,
and the round of each in `sample_rounds`, from each run's tensors.h5 where it is on this machine). Each
run is compared with the fastest run doing the same work (work_keys): `time_ratio` with its 95%
interval over the rounds (runner.ratio); the difference is within noise when the interval holds 1.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from pathlib import Path

import numpy as np
import pandas as pd

from runner import setups, tracking
from runner.ratio import UNSTABLE_DISAGREE, instability, time_ratio
from runner.result import RESULT_FILE, Result, ResultUnreadable, read_sample_rounds, read_samples
from runner.table import COLUMNS, PROSE, Column, format_seconds, present, rows
from runner.table import markdown as table_markdown

PANEL_KEYS = ("params.model.name", "params.task.name", "params.batch_size")  # a size sweep shares one panel
SETTING_PREFIXES = ("params.model.", "params.data.")  # the workload's own settings: model.n, data.image_size, ...
MAX_SIZE_TICKS = 8
SPEEDUP_LOG_ABOVE = 10  # a speedup axis spanning more than this factor is drawn on a log scale
SERIES_KEYS = ("params.backend.name", "params.mode.name", "params.device.name", "params.dtype")
# -- loading -------------------------------------------------------------------------------------


def runs_from_dirs(run_dirs: Iterable[Path]) -> pd.DataFrame:
    """One row per run directory that holds a result.json (an unreadable one is a FAILED row saying why)."""
    rows = []
    for run_dir in sorted(Path(d) for d in run_dirs):
        if not Result.exists(run_dir):
            continue
        try:
            result = Result.load(run_dir)
        except ResultUnreadable as error:
            result = Result(status="FAILED", error=str(error))
        name = tracking.run_name(result.config, *tracking.job_context(run_dir)) if result.config else run_dir.name
        row = {"run": name, "run_dir": str(run_dir), "status": result.status, "error": result.error}
        row["warnings"] = result.warnings
        row.update(setups.environment_columns(result.environment))
        row.update({f"params.{k}": v for k, v in tracking.run_params(result.config).items()})
        row.update({f"metrics.{k}": v for k, v in result.metrics.items()})
        rows.append(row)
    return _finish_frame(pd.DataFrame(rows))


def sweep_run_dirs(sweep_dir: Path) -> list[Path]:
    """The job directories of a sweep (Hydra's numbered subdirectories), in job order."""
    dirs = [p.parent for p in Path(sweep_dir).glob(f"*/{RESULT_FILE}")]
    return sorted(dirs, key=lambda d: (not d.name.isdigit(), int(d.name) if d.name.isdigit() else 0, d.name))


def runs_from_mlflow(uri: str, experiment: str, parent_run_id: str | None = None) -> pd.DataFrame:
    """The runs of an experiment (only the children of parent_run_id when given; never parent runs)."""
    return runs_from_mlflow_rows(tracking.search_runs(uri, experiment, parent_run_id))


def runs_from_mlflow_rows(rows: list[dict]) -> pd.DataFrame:
    """The frame of runs as tracking.search_runs / runs_of give them."""
    return _finish_frame(pd.DataFrame(rows))


def _finish_frame(frame: pd.DataFrame) -> pd.DataFrame:
    if frame.empty:
        return frame
    for key in ("metrics.time_median_s", "metrics.time_iqr_s"):  # absent when no run was timed
        if key not in frame:
            frame[key] = np.nan
    for key in ("params.batch_size", "params.seed", *(k for k in frame if str(k).startswith(SETTING_PREFIXES))):
        if key in frame and _all_numbers(frame[key]):
            frame[key] = pd.to_numeric(frame[key])
    frame["size"], frame["size_name"] = _sizes(frame)
    frame["setup"] = setups.setups(frame)
    run_dirs = frame.get("run_dir", [None] * len(frame))
    frame["samples_s"] = [read_samples(d) if d else None for d in run_dirs]
    frame["sample_rounds"] = [read_sample_rounds(d) if d else None for d in run_dirs]
    return frame


def _all_numbers(column: pd.Series) -> bool:
    """Whether every value given is a number (MLflow hands params back as strings: "1024")."""
    given = column.dropna()
    return not given.empty and pd.to_numeric(given, errors="coerce").notna().all() and given.map(type).ne(bool).all()


def numeric_settings(frame: pd.DataFrame) -> list[str]:
    """The numeric settings of the model or its inputs (params.model.n, params.model.hidden,
    params.data.image_size, ...): runs that differ in one of them did different work."""
    return [k for k in frame if str(k).startswith(SETTING_PREFIXES) and pd.api.types.is_numeric_dtype(frame[k])]


def work_keys(frame: pd.DataFrame) -> list[str]:
    """What two runs must share to be compared: model, task, batch size and the numeric settings of the model
    and its inputs. Everything else is what a comparison is for: backend, mode, device, dtype, and named
    alternatives (model.method of reshape, model.arch of torchvision)."""
    return [k for k in PANEL_KEYS if k in frame] + numeric_settings(frame)


def _sizes(frame: pd.DataFrame) -> tuple[pd.Series, pd.Series]:
    """Per run, its size and the setting that holds it, where exactly one numeric setting varies among the
    runs of its model (a size sweep: model.size of sigmoid, model.n of matmul); NaN and None elsewhere."""
    size, name = pd.Series(np.nan, index=frame.index), pd.Series(None, index=frame.index, dtype=object)
    settings = numeric_settings(frame)
    if "params.model.name" not in frame:
        return size, name
    for _, runs in frame.groupby(frame["params.model.name"].map(str)):
        varying = [k for k in settings if runs[k].nunique() > 1]
        if len(varying) == 1:
            size[runs.index], name[runs.index] = runs[varying[0]], short_name(varying[0])
    return size, name


# -- comparing -----------------------------------------------------------------------------------


NOT_LABELS = ("params.timing.", "params.tracking.")  # how long or where a run was recorded, not what it ran


def varied_params(frame: pd.DataFrame) -> list[str]:
    """The params.* columns whose value differs between runs that have the key: what the sweep varied
    (timing budgets and tracking settings aside)."""
    cols = [c for c in frame.columns if c.startswith("params.") and not c.startswith(NOT_LABELS)]
    return [c for c in cols if frame[c].dropna().map(str).nunique() > 1]


def short_name(column: str) -> str:
    return column.removeprefix("params.").removeprefix("metrics.").removesuffix(".name")


def labels(frame: pd.DataFrame, columns: list[str] | None = None) -> pd.Series:
    """A readable label per run from the parameters that varied: 'backend=torch mode=eager'."""
    columns = varied_params(frame) if columns is None else columns
    if not columns:
        return frame["run"].map(str)
    return frame[columns].map(str).apply(lambda row: " ".join(f"{short_name(c)}={v}" for c, v in row.items()), axis=1)


COMPARISON = ("time_ratio", "time_ratio_ci_low", "time_ratio_ci_high", "within_noise", "time_ratio_basis")


def compare(frame: pd.DataFrame) -> pd.DataFrame:
    """Add `time_ratio` (this run's time / the fastest's), its interval `time_ratio_ci_low`/`_high` (95% over
    the group's comparisons: runner.ratio) and `within_noise` against the fastest finished run that did the
    same work (work_keys). The fastest is the one with the lowest median. A run whose rounds disagree too
    much for a verdict says `unstable: ...` instead."""
    frame = frame.copy()
    for key in COMPARISON:
        frame[key] = None if key in ("within_noise", "time_ratio_basis") else np.nan
    if frame.empty or "metrics.time_median_s" not in frame:
        return frame
    timed = frame[(frame["status"] == "FINISHED") & frame["metrics.time_median_s"].notna()]
    keys = work_keys(frame) + (["setup"] if "setup" in frame else [])
    for _, group in timed.groupby([timed[k].map(str) for k in keys], sort=False):
        fastest = group["metrics.time_median_s"].idxmin()
        unstable = {i: _instability(frame.loc[i]) for i in group.index}
        for i in group.index:
            if i == fastest:
                frame.loc[i, COMPARISON] = [1.0, np.nan, np.nan, unstable[i] or "fastest", None]
                continue
            verdict = unstable[i] or ("cannot tell (the fastest job is unstable)" if unstable[fastest] else None)
            frame.loc[i, COMPARISON] = _versus(frame.loc[i], frame.loc[fastest], len(group) - 1, verdict)
    return frame


def _versus(run: pd.Series, fastest: pd.Series, comparisons: int, unstable: str | None) -> list:
    """time_ratio, its interval, within_noise and the basis of `run` against `fastest`; `unstable` says why
    there is no verdict, where one of the two jobs' rounds disagree too much for one."""
    by_medians = run["metrics.time_median_s"] / fastest["metrics.time_median_s"]
    if run["samples_s"] is None or fastest["samples_s"] is None:  # e.g. MLflow runs made on another machine
        return [by_medians, np.nan, np.nan, "cannot tell (no samples)", None]
    samples = (run["samples_s"], run.get("sample_rounds"), fastest["samples_s"], fastest.get("sample_rounds"))
    ratio = time_ratio(*samples, comparisons=comparisons)
    disagree = max(ratio.value / by_medians, by_medians / ratio.value)
    if not unstable and disagree > UNSTABLE_DISAGREE:
        unstable = f"unstable: {ratio.value:.2f}x over its rounds, {by_medians:.2f}x by the medians"
    return [ratio.value, ratio.low, ratio.high, unstable or ratio.within_noise(), ratio.basis()]


def _instability(run: pd.Series) -> str | None:
    return None if run["samples_s"] is None else instability(run["samples_s"], run.get("sample_rounds"))


def table(frame: pd.DataFrame) -> pd.DataFrame:
    """Raw numbers for runs.csv: run, status, what varied, the table's columns, error."""
    frame = compare(frame)
    records = _records(frame)
    columns = present(COLUMNS, records)
    out = pd.DataFrame({"run": frame["run"].to_numpy(), "status": frame["status"].to_numpy()})
    for key in varied_params(frame):
        out[short_name(key)] = frame[key].to_numpy()
    keys = [c.key for c in columns if c.key not in PROSE]
    keys += [k for k in COMPARISON if k not in keys]
    for key in keys:
        out[key] = [r.get(key) for r in records]
    out["error"] = frame["error"].to_numpy() if "error" in frame else None
    return out


def human_table(frame: pd.DataFrame, columns: tuple[Column, ...] = COLUMNS) -> tuple[list[str], list[list[str]]]:
    """Headers and formatted cells (human units): run, status, its setup where runs come from several (see
    setup_notes), what varied, then the table's columns."""
    frame = compare(frame)
    records = _records(frame)
    shown = present(columns, records)
    varied = (["setup"] if frame.get("setup", pd.Series(dtype=int)).nunique() > 1 else []) + varied_params(frame)
    headers = ["run", "status", *(short_name(k) for k in varied), *(c.label for c in shown)]
    cells = [
        [str(row["run"]), str(row["status"]), *(_param_cell(row[k]) for k in varied), *cells]
        for (_, row), cells in zip(frame.iterrows(), rows(shown, records), strict=True)
    ]
    return headers, cells


def _param_cell(value: object) -> str:
    """A parameter as typed: blank where the run has no such key, 1000 rather than 1000.0."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def markdown(frame: pd.DataFrame) -> str:
    """runs.md / summary.md: the human table as markdown, then one line per run that did not finish."""
    text = table_markdown(*human_table(frame)) + "".join(f"\n{line}\n" for line in setup_notes(frame))
    failed = frame[frame["status"] != "FINISHED"]
    if not failed.empty:
        text += "\n## Not finished\n\n" + "".join(
            f"- {r['run']} ({r['status']}): {r['error']}\n" for _, r in failed.iterrows()
        )
    return text


def setup_notes(frame: pd.DataFrame) -> list[str]:
    """Where the runs come from several setups (machines or versions: runner.setups), how each differs."""
    return setups.describe(frame, frame["setup"]) if "setup" in frame else []


def _records(frame: pd.DataFrame) -> list[dict]:
    """Per run, the values the table's columns read: metrics by their own names, and the comparison."""
    records = []
    for _, row in frame.iterrows():
        record = {k.removeprefix("metrics."): v for k, v in row.items() if str(k).startswith("metrics.")}
        record.update({k: row.get(k) for k in COMPARISON})
        record["time_ratio_ci"] = (row.get("time_ratio_ci_low"), row.get("time_ratio_ci_high"))
        records.append(record)
    return records


# -- plots ---------------------------------------------------------------------------------------


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
    title = f"{row.get('params.model.name', '?')} {row.get('params.task.name', '')}".strip()
    if pd.notna(row.get("params.batch_size")):
        title += f", batch {int(row['params.batch_size'])}"
    for key in settings:
        if pd.notna(row.get(key)):
            title += f", {short_name(key)} {_param_cell(row[key])}"
    return title


def _timed(frame: pd.DataFrame) -> pd.DataFrame:
    return frame[(frame["status"] == "FINISHED") & frame["metrics.time_median_s"].notna()]


def _panel_labels(rows: pd.DataFrame) -> pd.Series:
    """Per run, what varied among these comparable runs, wrapped to stay narrow; its name otherwise."""
    import textwrap

    columns = varied_params(rows) if len(rows) > 1 else []
    if not columns:
        return rows["run"].map(lambda name: textwrap.fill(str(name), 34))

    def label(row: pd.Series) -> str:
        return textwrap.fill(" ".join(f"{short_name(c)}={_param_cell(v)}" for c, v in row.items()), 34)

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
    """Time per call, one panel per workload: box plots of the raw samples (median and IQR otherwise)."""
    if _timed(frame).empty:
        return None
    groups = workloads(_timed(frame), PANEL_KEYS)
    plt = _pyplot()
    fig, axes = _panels(plt, groups, [len(g) for _, g in groups])
    for ax, (title, group) in zip(axes, groups, strict=True):
        _time_panel(ax, group.sort_values("metrics.time_median_s"), title)
    axes[-1].set_xlabel("time per call (box: median and IQR of the raw samples; log scale)")
    fig.suptitle("Time per configuration, faster at the top of each panel")
    return _save(fig, path)


def _time_panel(ax, group: pd.DataFrame, title: str) -> None:
    for pos, (_, row) in enumerate(group.iterrows()):
        samples = row["samples_s"]
        if samples is not None and len(samples):
            ax.boxplot([samples], positions=[pos], orientation="horizontal", widths=0.6, showfliers=True)
        else:
            half = row.get("metrics.time_iqr_s", 0) / 2
            ax.errorbar(row["metrics.time_median_s"], pos, xerr=half, fmt="o", capsize=4)
    ax.set_yticks(range(len(group)), _panel_labels(group))
    ax.set_ylim(len(group) - 0.5, -0.5)
    _seconds_axis(ax.xaxis)
    ax.set_title(title, loc="left", fontsize=10)
    ax.grid(axis="x", which="both", alpha=0.3)


def series_labels(frame: pd.DataFrame) -> pd.Series:
    """One line per configuration in a size plot: backend / mode / device / dtype and named alternatives
    (model.method, model.arch), those that differ among these runs."""
    numeric = numeric_settings(frame)
    named = [k for k in frame if str(k).startswith(SETTING_PREFIXES) and k not in numeric and k not in PANEL_KEYS]
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
    sized = _timed(frame)[_timed(frame)["size"].notna()]
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
        ax.set_xlabel(_size_label(timed))
        ax.set_ylabel("time per call (median, IQR bars)")
        ax.set_title(f"{title}: time against size", loc="left", fontsize=10)
        ax.grid(which="both", alpha=0.3)
        ax.legend()
    return _save(fig, path)


def plot_speedups(frame: pd.DataFrame, path: Path) -> Path | None:
    """How many times faster each configuration is than the slowest one doing the same work, a panel
    per workload (against size for size sweeps)."""
    in_size_sweeps = {i for _, g in _size_groups(frame) for i in g.index}
    timed = _timed(frame).drop(index=list(in_size_sweeps))
    groups = [(t, g) for t, g in workloads(timed) if len(g) >= 2]
    if not groups:
        return None
    plt = _pyplot()
    fig, axes = _panels(plt, groups, [len(g) for _, g in groups])
    for ax, (title, group) in zip(axes, groups, strict=True):
        speedup = (group["metrics.time_median_s"].max() / group["metrics.time_median_s"]).sort_values()
        bars = ax.barh(range(len(speedup)), speedup.to_numpy())
        ax.bar_label(bars, labels=[f"{s:.3g}x" for s in speedup], padding=3)
        ax.set_yticks(range(len(speedup)), _panel_labels(group.loc[speedup.index]))
        ax.set_xlim(0, speedup.max() * 1.18)  # room for the last bar's label
        ax.set_title(title, loc="left", fontsize=10)
        ax.grid(axis="x", alpha=0.3)
    axes[-1].set_xlabel("speedup over the slowest configuration of the panel (median time ratio)")
    fig.suptitle("Speedups")
    return _save(fig, path)


def plot_speedup_vs_size(frame: pd.DataFrame, path: Path) -> Path | None:
    """Size sweeps comparing two or more backends/modes: speedup over the slowest against size."""
    groups = [(t, g) for t, g in _size_groups(frame) if series_labels(g).nunique() >= 2]
    if not groups:
        return None
    plt = _pyplot()
    fig, axes = plt.subplots(len(groups), 1, figsize=(8, 5 * len(groups)), squeeze=False)
    for ax, (title, timed) in zip(axes[:, 0], groups, strict=True):
        timed = timed.assign(series=series_labels(timed))
        times = timed.pivot_table(index="size", columns="series", values="metrics.time_median_s", aggfunc="median")
        baseline = times.iloc[-1].idxmax()  # the slowest configuration at the largest size
        speedups = times.rdiv(times[baseline], axis=0)
        for name in times.columns:
            ax.plot(times.index, speedups[name], marker="o", label=name)
        _size_axis(ax, timed["size"])
        ax.set_xlabel(_size_label(timed))
        spans_decades = speedups.max().max() / speedups.min().min() > SPEEDUP_LOG_ABOVE
        if spans_decades:  # 870x and 1.9x on one linear axis: the small ones sit on the floor
            ax.set_yscale("log")
        ax.set_ylabel(f"speedup over {baseline}" + (" (log scale)" if spans_decades else ""))
        ax.set_title(f"{title}: speedups against size", loc="left", fontsize=10)
        ax.grid(which="both", alpha=0.3)
        ax.legend()
    return _save(fig, path)


def _size_label(timed: pd.DataFrame) -> str:
    return f"{timed['size_name'].iloc[0]} (log scale)"


def _seconds_axis(axis) -> None:
    """A log axis of seconds labelled '10 µs', '1 ms', ..."""
    from matplotlib.ticker import FuncFormatter, NullFormatter

    axis.axes.set_xscale("log") if axis is axis.axes.xaxis else axis.axes.set_yscale("log")
    axis.set_major_formatter(FuncFormatter(lambda value, _: format_seconds(value)))
    axis.set_minor_formatter(NullFormatter())


def _save(fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110, bbox_inches="tight")  # long labels widen the image instead of being cut
    import matplotlib.pyplot as plt

    plt.close(fig)
    return path


# -- the whole report ----------------------------------------------------------------------------


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
    )
    return written + [p for p in plots if p is not None]


def log_to_parent(uri: str, parent_run_id: str, files: list[Path], artifact_path: str = "report") -> None:
    """Attach report files to a sweep's parent run."""
    tracking.log_files(uri, parent_run_id, files, artifact_path)

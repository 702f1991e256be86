"""A multirun as one MLflow parent run with a child per job, and a summary that survives failures.

`SweepCallback` (listed under `hydra.callbacks` in conf/config.yaml) runs in the launching process:
`on_multirun_start` creates the experiment once (so parallel jobs never race on a fresh SQLite store)
and the parent run, and writes `sweep.json` in the sweep directory, where every job (in this process,
a joblib worker or a SLURM node sharing the directory) reads the parent's id. Hydra skips
`on_multirun_end` when a job raises, so run.py also calls `finish` after Hydra returns, whatever
happened; `finish` runs once: it prints the summary table, writes summary/report files, logs them to
the parent run, ends the parent with a truthful status and returns the sweep's exit code.
"""

from __future__ import annotations

import json
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from runner import tracking

SWEEP_FILE = "sweep.json"
EXIT_INTERRUPTED = 130


@dataclass
class Sweep:
    sweep_dir: Path
    note: dict
    exit_code: int | None = None  # set once finished


_active: Sweep | None = None


class SweepCallback(Callback):
    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        start(config)

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        finish()


def start(config: DictConfig) -> Sweep:
    """Create the sweep directory, the parent run (when tracked) and sweep.json."""
    global _active
    sweep_dir = Path(str(config.hydra.sweep.dir)).resolve()
    sweep_dir.mkdir(parents=True, exist_ok=True)
    overrides = [str(o) for o in config.hydra.overrides.task]
    note = {
        "sweep_dir": str(sweep_dir),
        "overrides": overrides,
        "launcher": str(config.hydra.launcher.get("_target_", "")),
        "tracking": str(config.tracking.name),
        "uri": config.tracking.uri,
        "experiment": config.tracking.experiment,
        "parent_run_id": None,
        "started": time.strftime("%Y-%m-%d %H:%M:%S"),
    }
    parallel = parallel_launcher(config.hydra.launcher)
    if parallel:
        print(
            f"warning: {parallel}: jobs that run at the same time share cores, caches and memory bandwidth, "
            "so their timings disturb each other; time what you publish with the basic launcher",
            file=sys.stderr,
        )
    if note["tracking"] == "mlflow":
        try:
            note["parent_run_id"] = create_parent_run(note)
        except Exception as error:  # the store is down: jobs keep their results locally for `runner sync`
            note["error"] = _first_line(error)
            print(f"warning: no parent run in MLflow at {note['uri']} ({note['error']})", file=sys.stderr)
    write_note(sweep_dir, note)
    _active = Sweep(sweep_dir, note)
    return _active


def parallel_launcher(launcher: DictConfig) -> str | None:
    """A description of how jobs share this machine, or None when they run one at a time."""
    target = str(launcher.get("_target_", ""))
    n_jobs = launcher.get("n_jobs")
    if target.endswith("JoblibLauncher") and n_jobs != 1:
        at_once = "one job per core" if n_jobs == -1 else f"up to {n_jobs} jobs"
        return f"the joblib launcher runs {at_once} at once on this machine"
    if target.endswith("submitit_launcher.LocalLauncher"):
        return "submitit's local executor runs the jobs at once on this machine"
    return None


def create_parent_run(note: dict) -> str:
    tracking.check_reachable(note["uri"])
    tracking.open_store(note["uri"])
    from mlflow.entities import Param
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=note["uri"])
    experiment_id = tracking.ensure_experiment(client, note["uri"], note["experiment"])
    tags = {
        "mlflow.runName": f"sweep {Path(note['sweep_dir']).parent.name}/{Path(note['sweep_dir']).name}",
        "sweep_dir": note["sweep_dir"],
        "launcher": note["launcher"],
        "overrides": " ".join(note["overrides"])[:5000],
    }
    run = tracking.retry_on_lock(client.create_run, experiment_id, tags=tags)
    params = [Param(k, v) for k, v in dict(_split_override(o) for o in note["overrides"]).items()]  # last wins
    if params:
        tracking.retry_on_lock(client.log_batch, run.info.run_id, params=params)
    return run.info.run_id


def _split_override(override: str) -> tuple[str, str]:
    key, _, value = override.partition("=")
    return key.lstrip("+~"), value[:6000]


def write_note(sweep_dir: Path, note: dict) -> None:
    (Path(sweep_dir) / SWEEP_FILE).write_text(json.dumps(note, indent=2) + "\n")


def read_note(sweep_dir: Path) -> dict:
    path = Path(sweep_dir) / SWEEP_FILE
    return json.loads(path.read_text()) if path.exists() else {}


def parent_run_id(sweep_dir: str | Path) -> str | None:
    """In a job: the id of its sweep's parent run, if the sweep has one."""
    return read_note(Path(sweep_dir).resolve()).get("parent_run_id")


def active() -> Sweep | None:
    return _active


def finish(interrupted: bool = False) -> int | None:
    """Summarise and close the active sweep once; returns its exit code (None when none is active)."""
    sweep = _active
    if sweep is None:
        return None
    if sweep.exit_code is not None:
        return sweep.exit_code
    from runner import report

    frame = report.runs_from_dirs(report.sweep_run_dirs(sweep.sweep_dir))
    statuses = list(frame["status"]) if not frame.empty else []
    status = sweep_status(statuses, interrupted)
    sweep.exit_code = {"FINISHED": 0, "FAILED": 1, "KILLED": EXIT_INTERRUPTED}[status]
    files: list[Path] = []
    if not frame.empty:
        print_table(frame, sweep.sweep_dir)
        files = _write_files(frame, sweep.sweep_dir)
    elif not interrupted:
        print(f"error: the sweep in {sweep.sweep_dir} recorded no job", file=sys.stderr)
    sweep.note.update(status=status, ended=time.strftime("%Y-%m-%d %H:%M:%S"), n_jobs=len(statuses))
    write_note(sweep.sweep_dir, sweep.note)
    if sweep.note.get("parent_run_id"):
        _close_parent(sweep, statuses, status, files)
    return sweep.exit_code


def sweep_status(statuses: list[str], interrupted: bool) -> str:
    """FINISHED only when every job finished; KILLED when the sweep was stopped; FAILED otherwise."""
    if interrupted or "KILLED" in statuses:
        return "KILLED"
    if not statuses or any(s != "FINISHED" for s in statuses):
        return "FAILED"
    return "FINISHED"


def _write_files(frame, sweep_dir: Path) -> list[Path]:
    from runner import report

    files = []
    try:
        files = report.write_report(frame, sweep_dir / "report")
    except Exception as error:  # a plot that cannot be drawn must not hide the results
        print(f"warning: could not write the sweep's report ({_first_line(error)})", file=sys.stderr)
    summary = sweep_dir / "summary.md"
    summary.write_text(_summary_markdown(frame))
    return [summary, *files]


def _summary_markdown(frame) -> str:
    from runner import report

    rows = report.table(frame)
    failed = frame[frame["status"] != "FINISHED"]
    text = f"# Sweep summary\n\n{report.markdown(rows)}"
    if not failed.empty:
        text += "\n## Not finished\n\n" + "".join(
            f"- job {r['run']} ({r['status']}): {r['error']}\n" for _, r in failed.iterrows()
        )
    return text


def _close_parent(sweep: Sweep, statuses: list[str], status: str, files: list[Path]) -> None:
    from mlflow.entities import Metric
    from mlflow.tracking import MlflowClient

    note = sweep.note
    run_id = note["parent_run_id"]
    try:
        client = MlflowClient(tracking_uri=note["uri"])
        now = int(time.time() * 1000)
        counts = {
            "n_jobs": len(statuses),
            "n_finished": statuses.count("FINISHED"),
            "n_failed": statuses.count("FAILED"),
            "n_killed": statuses.count("KILLED"),
        }
        metrics = [Metric(k, float(v), now, 0) for k, v in counts.items()]
        tracking.retry_on_lock(client.log_batch, run_id, metrics=metrics)
        for path in [sweep.sweep_dir / SWEEP_FILE, sweep.sweep_dir / "multirun.yaml", *files]:
            if path.exists():
                folder = "report" if path.parent.name == "report" else None
                tracking.retry_on_lock(client.log_artifact, run_id, str(path), folder)
        tracking.retry_on_lock(client.set_terminated, run_id, status)
    except Exception as error:
        print(f"warning: could not close the parent run {run_id} ({_first_line(error)})", file=sys.stderr)


def print_table(frame, sweep_dir: Path) -> None:
    """One row per job: what varied, median ± IQR, throughput, vs the fastest, noise, error."""
    from rich.console import Console
    from rich.table import Table

    from runner import report
    from runner.timing import format_seconds

    frame = report.compare(frame)
    varied = report.varied_params(frame)
    table = Table(title=f"Sweep: {len(frame)} jobs in {sweep_dir}", title_justify="left")
    columns = ["job", *(report.short_name(c) for c in varied), "status", "median ± IQR", "first call", "examples/s"]
    for column in [*columns, "p90 / p99", "time / fastest", "within noise (MWU p)", "max rel err"]:
        table.add_column(column, overflow="fold")
    for _, row in frame.iterrows():
        median = row.get("metrics.time_median_s")
        timed = median is not None and not _nan(median)
        cells = [str(row["run"]), *(str(row[c]) for c in varied), _status(row["status"])]
        cells += [
            f"{format_seconds(median)} ± {format_seconds(row['metrics.time_iqr_s'])}" if timed else "",
            format_seconds(row["metrics.first_call_s"]) if timed else "",  # tracing, compilation, device start-up
            _num(row.get("metrics.throughput_per_s")),
            _tail(row) if timed else "",
            "" if _nan(row["vs_fastest"]) else f"{row['vs_fastest']:.2f}x",
            _noise(row["within_noise"], row["p_value"]),
            _num(row.get("metrics.max_rel_err_vs_reference")),
        ]
        table.add_row(*cells)
    console = Console() if sys.stdout.isatty() else Console(width=160)
    console.print(table)
    for _, row in frame[frame["status"] != "FINISHED"].iterrows():
        console.print(f"[bold red]{row['status']}[/] job {row['run']}: {row['error']}", highlight=False)


def _tail(row) -> str:
    from runner.timing import format_seconds

    p90, p99 = row.get("metrics.time_p90_s"), row.get("metrics.time_p99_s")
    return "" if p90 is None or _nan(p90) else f"{format_seconds(p90)} / {format_seconds(p99)}"


def _status(status: str) -> str:
    return {"FINISHED": "[green]FINISHED[/]", "FAILED": "[bold red]FAILED[/]"}.get(status, f"[yellow]{status}[/]")


def _noise(verdict, p) -> str:
    if verdict is None:
        return ""
    return f"{verdict} (p={p:.2g})" if verdict in ("yes", "no") else verdict


def _num(value) -> str:
    return "" if value is None or _nan(value) else f"{value:.3g}"


def _nan(value) -> bool:
    return isinstance(value, float) and math.isnan(value)


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


def sync_sweep(sweep_dir: Path, uri: str | None, sync_one) -> list[tuple[Path, str]]:
    """Upload a sweep kept locally: its parent run (created now if the store was down), then its jobs."""
    from runner import report

    sweep_dir = Path(sweep_dir)
    note = read_note(sweep_dir)
    if note.get("tracking") != "mlflow":
        return [(sweep_dir, "error: this sweep ran with tracking=none: there is nothing to upload")]
    note["uri"] = uri or note.get("uri")
    lines: list[tuple[Path, str]] = []
    if not note.get("parent_run_id"):
        try:
            note["parent_run_id"] = create_parent_run(note)
        except Exception as error:
            return [(sweep_dir, f"error: could not create the parent run ({_first_line(error)})")]
        note.pop("error", None)
        write_note(sweep_dir, note)
        lines.append((sweep_dir, f"parent run {note['parent_run_id']} created"))
    run_dirs = report.sweep_run_dirs(sweep_dir)
    for run_dir in run_dirs:
        _adopt(run_dir, note["parent_run_id"])
        lines.append((run_dir, sync_one(run_dir, uri)))
    statuses = [tracking.read_result(d)["status"] for d in run_dirs]
    status = note.get("status") or sweep_status(statuses, interrupted=False)
    files = [p for p in [sweep_dir / "summary.md", *sorted((sweep_dir / "report").glob("*"))] if p.is_file()]
    _close_parent(Sweep(sweep_dir, note), statuses, status, files)
    return lines


def _adopt(run_dir: Path, parent_id: str) -> None:
    """A job that ran while there was no parent run becomes a child of the one created at sync."""
    path = run_dir / tracking.TRACKING_FILE
    if path.exists():
        job_note = json.loads(path.read_text())
        if not job_note.get("synced") and not job_note.get("parent_run_id"):
            path.write_text(json.dumps({**job_note, "parent_run_id": parent_id}, indent=2) + "\n")

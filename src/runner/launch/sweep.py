"""A multirun as one MLflow parent run with a child per job, and a summary that survives failures.

`SweepCallback` (listed under `hydra.callbacks` in conf/config.yaml) runs in the launching process:
`on_multirun_start` creates the experiment once (so parallel jobs never race on a fresh SQLite store)
and the parent run, and writes `sweep.json` in the sweep directory, where every job (in this process,
a joblib worker or a SLURM node sharing the directory) reads the parent's id. `on_multirun_end` calls
`finish`: it prints the summary table, writes summary/report files, logs them to the parent run, ends the
parent with a truthful status, and exits with the sweep's code. Hydra skips `on_multirun_end` when the
launch is stopped (Ctrl-C, SIGTERM, a refused submission): the launcher then calls `finish` itself
(`ClosesSweepWhenStopped`). The sweep's state is its sweep.json; `finish` acts once (its status is written).
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from hydra.core.utils import JobReturn
from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from runner import tracking
from runner.config import first_line
from runner.launch import launchers
from runner.launch.sweep_lines import grouped_warnings
from runner.launch.terminal import print_answer
from runner.record import naming
from runner.record.result import Status
from runner.record.sweep_file import SWEEP_FILE, read_sweep_file, write_sweep_file

log = logging.getLogger(__name__)

EXIT_INTERRUPTED = 130
EXIT_CODES: dict[str, int] = {Status.FINISHED: 0, Status.FAILED: 1, Status.KILLED: EXIT_INTERRUPTED}


@dataclass
class Sweep:
    sweep_dir: Path
    info: dict  # sweep.json


class SweepCallback(Callback):
    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        start(config)

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        code = finish(Path(str(config.hydra.sweep.dir)))
        if code:
            raise SystemExit(code)


class ClosesSweepWhenStopped:
    """A launcher mixin: where launching is stopped (Ctrl-C, SIGTERM, a refused submission), Hydra skips
    on_multirun_end, so the launcher closes the sweep before the stop goes on."""

    config: DictConfig

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        try:
            return super().launch(job_overrides, initial_job_idx)  # type: ignore[misc]
        except KeyboardInterrupt as stop:
            from runner.measure.stop import stop_reason

            finish(Path(str(self.config.hydra.sweep.dir)), interrupted=stop_reason(stop))
            raise
        except launchers.SweepRefused as refused:
            record_launch_error(Path(str(self.config.hydra.sweep.dir)), refused.line)
            finish(Path(str(self.config.hydra.sweep.dir)))
            raise SystemExit(1) from None


def start(config: DictConfig) -> Sweep:
    """Create the sweep directory, the parent run (when tracked) and sweep.json."""
    if launchers.cluster_launcher(config.hydra.launcher):
        refuse_local_devices(config.hydra.sweeper.get("params"))
    sweep_dir = Path(str(config.hydra.sweep.dir)).resolve()
    sweep_dir.mkdir(parents=True, exist_ok=True)
    overrides = [str(o) for o in config.hydra.overrides.task]
    info = {
        "sweep_dir": str(sweep_dir),
        "overrides": overrides,
        "hydra_overrides": [str(o) for o in config.hydra.overrides.hydra if not str(o).startswith("hydra.mode=")],
        "sweeper_params": {str(k): str(v) for k, v in (config.hydra.sweeper.get("params") or {}).items()},
        "launcher": str(config.hydra.launcher.get("_target_", "")),
        "tracking": str(config.tracking.name),
        "uri": config.tracking.uri,
        "experiment": config.tracking.experiment,
        "parent_run_id": None,
        "started": time.strftime("%Y-%m-%d %H:%M:%S"),
    }
    parallel = launchers.parallel_launcher(config.hydra.launcher)
    if parallel:
        log.warning(
            f"{parallel}: jobs that run at the same time share cores, caches and memory bandwidth, "
            "so their timings disturb each other; time what you publish with the basic launcher"
        )
    local_store = info["tracking"] == "mlflow" and str(info["uri"]).startswith(("sqlite:", "file:", "/"))
    if local_store and launchers.cluster_launcher(config.hydra.launcher):
        log.warning(
            f"tracking.uri={info['uri']} is a file on this machine, and every node of the cluster writes "
            "to it: it must be on a file system they all share, where SQLite locks badly; set MLFLOW_TRACKING_URI "
            "to an `mlflow server` the nodes can reach"
        )
    if info["tracking"] == "mlflow":
        try:
            info["parent_run_id"] = tracking.create_parent_run(info)
        except Exception as error:  # the store is down: jobs keep their results locally for `runner sync`
            info["error"] = first_line(error)
            log.warning(f"no parent run in MLflow at {info['uri']} ({info['error']})")
    write_sweep_file(sweep_dir, info)
    return Sweep(sweep_dir, info)


def refuse_local_devices(params: DictConfig | None) -> None:
    """A sweep sent to other machines cannot take its devices from `${runner.devices:}`: it would list the
    devices of this, the submitting host, which may lack the nodes' GPUs. One line, exit 1."""
    from omegaconf import OmegaConf

    swept = cast(dict[str, Any], OmegaConf.to_container(params, resolve=False)) if params else {}  # a DictConfig's
    for key, value in swept.items():
        if "${runner.devices:" in str(value):
            print(
                f"error: {key}: ${{runner.devices:}} lists the devices of this host, not of the nodes the jobs run "
                f"on: name them instead ({key}=cpu,cuda)",
                file=sys.stderr,
            )
            raise SystemExit(1)


def parent_run_id(sweep_dir: str | Path) -> str | None:
    """In a job: the id of its sweep's parent run, if the sweep has one."""
    return read_sweep_file(Path(sweep_dir).resolve()).get("parent_run_id")


def finish(sweep_dir: Path, interrupted: str | None = None) -> int:
    """Summarise and close the sweep in `sweep_dir` once; returns its exit code. `interrupted`: what stopped
    the sweep, if anything did."""
    from runner import report

    sweep = Sweep(Path(sweep_dir), read_sweep_file(sweep_dir))
    if sweep.info.get("status"):  # closed already
        return EXIT_CODES[sweep.info["status"]]
    frame = report.runs_from_dirs(report.sweep_run_dirs(sweep.sweep_dir))
    statuses = list(frame["status"]) if not frame.empty else []
    status = sweep_status(statuses, bool(interrupted))
    files: list[Path] = []
    if not frame.empty:
        print_table(frame, sweep.sweep_dir)
        files = _write_files(frame, sweep.sweep_dir)
    elif not interrupted:
        reason = sweep.info.get("launch_error") or f"the sweep in {sweep.sweep_dir} recorded no job"
        print(f"error: {reason}", file=sys.stderr)
    sweep.info.update(status=status, ended=time.strftime("%Y-%m-%d %H:%M:%S"), n_jobs=len(statuses))
    write_sweep_file(sweep.sweep_dir, sweep.info)
    if sweep.info.get("parent_run_id"):
        _close_parent(sweep, statuses, status, files)
    return EXIT_CODES[status]


def note_jobs_launched(sweep_dir: Path, count: int) -> None:
    """How many jobs the sweep has launched so far (sweep.json), so each job's line can say `[k/N]`."""
    info = read_sweep_file(sweep_dir)
    if info:
        write_sweep_file(sweep_dir, {**info, "jobs_launched": count})


def record_launch_error(sweep_dir: Path, line: str) -> None:
    """A launcher refused the sweep: the reason goes into sweep.json (finish prints it) and onto the parent run."""
    info = read_sweep_file(sweep_dir)
    info["launch_error"] = line
    write_sweep_file(sweep_dir, info)
    if info.get("parent_run_id"):
        try:
            tracking.retry_on_lock(tracking.client(info["uri"]).set_tag, info["parent_run_id"], "error", line)
        except Exception as error:  # sweep.json keeps the reason whatever the store does
            log.warning(f"could not tag the parent run ({first_line(error)})")


def import_report_meanwhile() -> None:
    """Once nothing is timed any more, import what the summary and the report need (pandas, matplotlib,
    scipy's t quantile: most of a second) while the workers write their records."""

    def load() -> None:
        from scipy.special import stdtrit  # noqa: F401

        from runner.report import plots

        plots._pyplot()

    threading.Thread(target=load, name="import-report", daemon=True).start()


def sweep_status(statuses: list[str], interrupted: bool) -> str:
    """FINISHED only when every job finished; KILLED when the sweep was stopped; FAILED otherwise."""
    if interrupted or Status.KILLED in statuses:
        return Status.KILLED
    if not statuses or any(s != Status.FINISHED for s in statuses):
        return Status.FAILED
    return Status.FINISHED


def _write_files(frame, sweep_dir: Path) -> list[Path]:
    from runner import report

    files = []
    try:
        files = report.write_report(frame, sweep_dir / "report")
    except Exception as error:  # a plot that cannot be drawn must not hide the results
        log.warning(f"could not write the sweep's report ({first_line(error)})")
    summary = sweep_dir / "summary.md"
    answer = report.answer(frame)
    summary.write_text(f"# Sweep summary\n\n{answer.markdown}\n{answer.details}")
    _note_comparisons(report.compare(frame))
    return [summary, *files]


def _note_comparisons(compared) -> None:
    """Each job's MLflow run gains how it compares with the fastest job doing the same work: the metrics
    time_ratio, time_ratio_ci_low and time_ratio_ci_high (as the tables print them), and a line in its description."""
    from runner.record.table import ratio_figure

    for _, row in compared[compared["time_ratio"].notna()].iterrows():
        link = tracking.read_link(Path(row["run_dir"]))
        if not link.get("run_id"):
            continue
        metrics = {k: ratio_figure(row[k]) for k in ("time_ratio", "time_ratio_ci_low", "time_ratio_ci_high")}
        try:
            tracking.log_comparison(link["uri"], link["run_id"], metrics, comparison_line(row))
        except Exception as error:  # the record on disk is complete; the comparison is a nicety
            log.warning(f"could not annotate run {link['run_id']} ({first_line(error)})")


def comparison_line(row) -> str:
    """'1.31x the time of the fastest comparable job of the sweep (95% interval 1.27–1.35x over 40 rounds: slower)'."""
    from runner.record.table import format_interval, format_ratio
    from runner.report.comparison import Verdict

    verdict = row["verdict"]
    if verdict == Verdict.FASTEST or row["time_ratio"] == 1.0:  # an unstable fastest job too
        fastest = "the fastest comparable job of the sweep"
        return fastest if verdict == Verdict.FASTEST else f"{fastest} ({row['within_noise']})"
    line = f"{format_ratio(row['time_ratio'])} the time of the fastest comparable job of the sweep"
    if verdict in (Verdict.WITHIN_NOISE, Verdict.SLOWER):
        interval = format_interval((row["time_ratio_ci_low"], row["time_ratio_ci_high"]))
        return f"{line} (95% interval {interval} over {row['time_ratio_basis']}: {row['within_noise']})"
    return f"{line} ({row['within_noise']})"


def _close_parent(sweep: Sweep, statuses: list[str], status: str, files: list[Path]) -> None:
    from runner import report

    counts = {
        "n_jobs": len(statuses),
        "n_finished": statuses.count(Status.FINISHED),
        "n_failed": statuses.count(Status.FAILED),
        "n_killed": statuses.count(Status.KILLED),
    }
    files = [sweep.sweep_dir / SWEEP_FILE, sweep.sweep_dir / "multirun.yaml", *files]
    try:
        frame = report.runs_from_dirs(report.sweep_run_dirs(sweep.sweep_dir))
        answer = report.answer(frame) if not frame.empty else None
        tracking.close_parent_run(sweep.info, counts, files, status, answer)
        sweep.info["parent_closed"] = True
        write_sweep_file(sweep.sweep_dir, sweep.info)
    except Exception as error:
        log.warning(f"could not close the parent run {sweep.info['parent_run_id']} ({first_line(error)})")


def print_table(frame, sweep_dir: Path) -> None:
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
    _log_warnings(frame)
    _print_link(console, sweep_dir)


def _log_warnings(frame) -> None:
    """The jobs' warnings, each once with the jobs it concerns (runner.launch.sweep_lines.grouped_warnings)."""
    if "warnings" not in frame:
        return
    rows = frame[frame["warnings"].map(bool)]
    for line in grouped_warnings((_job(row), list(row["warnings"])) for _, row in rows.iterrows()):
        log.warning(line)


def _print_link(console, sweep_dir: Path) -> None:
    """The parent run and how to open it in the MLflow UI."""
    info = read_sweep_file(sweep_dir)
    if info.get("parent_run_id"):
        from runner.launch.terminal import ui_lines

        console.print(f"MLflow parent run {info['parent_run_id']} ({naming.sweep_title(info)})", highlight=False)
        for line in ui_lines(info["uri"], f"#/runs/{info['parent_run_id']}"):
            console.print(line.strip(), highlight=False, soft_wrap=True)


def _job(row) -> str:
    """A job's number (its directory under the sweep), as Hydra and the table's run names count it."""
    return Path(row["run_dir"]).name


def _status(status: str) -> str:
    colours: dict[str, str] = {Status.FINISHED: "green", Status.FAILED: "bold red"}
    return f"[{colours.get(status, 'yellow')}]{status}[/]"


def sync_sweep(sweep_dir: Path, uri: str | None) -> list[tracking.Synced]:
    """Upload a sweep kept locally: its parent run (created now if the store was down), then its jobs."""
    sweep_dir = Path(sweep_dir)
    info = read_sweep_file(sweep_dir)
    if info.get("tracking") != "mlflow":
        detail = "this sweep ran with tracking=none: there is nothing to upload"
        return [tracking.Synced(sweep_dir, tracking.SyncState.FAILED, detail)]
    info["uri"] = uri or info.get("uri")
    done: list[tracking.Synced] = []
    if not info.get("parent_run_id"):
        try:
            info["parent_run_id"] = tracking.create_parent_run(info)
        except Exception as error:
            detail = f"could not create the parent run ({first_line(error)})"
            return [tracking.Synced(sweep_dir, tracking.SyncState.FAILED, detail)]
        info.pop("error", None)
        write_sweep_file(sweep_dir, info)
        done.append(tracking.Synced(sweep_dir, tracking.SyncState.CREATED, info["parent_run_id"]))
    run_dirs = job_dirs(sweep_dir)
    for run_dir in run_dirs:
        _adopt(run_dir, info["parent_run_id"])
        done.append(tracking.sync_one(run_dir, uri))
    statuses = [job_status(d) for d in run_dirs]
    # A sweep that never reached `finish` was stopped (its launcher killed): never FINISHED.
    status = info.get("status") or sweep_status(statuses, interrupted=True)
    files = [p for p in [sweep_dir / "summary.md", *sorted((sweep_dir / "report").glob("*"))] if p.is_file()]
    changed = any(synced.state != tracking.SyncState.ALREADY for synced in done)
    if changed or not info.get("parent_closed"):
        _close_parent(Sweep(sweep_dir, info), statuses, status, files)
    return done


def job_dirs(sweep_dir: Path) -> list[Path]:
    """The job directories of a sweep: those with a result, and those whose job never recorded one."""
    from runner import report

    found = set(report.sweep_run_dirs(sweep_dir))
    found |= {p.parent for p in Path(sweep_dir).glob(f"*/{tracking.TRACKING_FILE}")}
    return sorted(found, key=lambda d: (not d.name.isdigit(), int(d.name) if d.name.isdigit() else 0, d.name))


def job_status(run_dir: Path) -> str:
    """A job's recorded status; an unreadable record is FAILED, a missing one KILLED."""
    from runner.record.result import Result, ResultUnreadable

    if not Result.exists(run_dir):
        return Status.KILLED
    try:
        return Result.load(run_dir).status
    except ResultUnreadable:
        return Status.FAILED


def _adopt(run_dir: Path, parent_id: str) -> None:
    """A job that ran while there was no parent run becomes a child of the one created at sync."""
    try:
        link = tracking.read_link(run_dir)
    except ValueError:  # an unreadable tracking.json: its sync says so
        return
    if link and not link.get("synced") and not link.get("parent_run_id"):
        tracking.write_link(run_dir, {**link, "parent_run_id": parent_id})

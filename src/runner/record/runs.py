"""A recorded run, typed: where it is, its identity (runner.identity), its params, timings' summary, metrics and
environment, read once from wherever it was kept. Every table, comparison and history reads Runs.

Runs load from a run directory or a sweep directory here (result.json), and from MLflow in runner.tracking.search
(its tags and params). `Run.timed` is the one test of "finished and timed": what a comparison or a history can use.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path

from runner import identity
from runner.identity import Identity, Key
from runner.record import naming
from runner.record.result import RESULT_FILE, Result, ResultUnreadable, Status
from runner.record.sweep_file import SWEEP_FILE, control_of

IS_CONTROL_TAG = "is_control"  # on the control's own run: "true"
CONTROL_TAG = "control_case"  # on the others' runs of its sweep: the control's case (runner.history reads it)


@dataclass(frozen=True)
class Run:
    name: str  # as the MLflow UI and the tables show it
    status: str  # MLflow's word (Status), RUNNING for a run MLflow holds as running
    identity: Identity | None  # None: refused before it ran, no environment recorded
    params: dict[str, str] = field(default_factory=dict)  # the settings that apply, as MLflow holds them
    metrics: dict[str, float] = field(default_factory=dict)  # seconds, as result.json holds them
    environment: dict[str, str] = field(default_factory=dict)
    run_dir: str | None = None  # where its files are on this machine (samples in tensors.h5)
    run_id: str | None = None  # its MLflow run
    started: float = 0.0  # epoch seconds
    error: str | None = None
    warnings: tuple[str, ...] = ()
    tags: dict[str, str] = field(default_factory=dict)  # its MLflow tags, where it came from MLflow
    experiment_id: str = ""  # its MLflow experiment, where it came from MLflow (a link to its page names it)

    @property
    def where(self) -> str:
        """Its MLflow run id, else its directory."""
        return self.run_id or self.run_dir or self.name

    @property
    def sweep(self) -> str:
        """The sweep it belongs to: its MLflow parent run, else its sweep directory; '' for a single run."""
        if self.tags.get("mlflow.parentRunId"):
            return self.tags["mlflow.parentRunId"]
        parent = Path(self.run_dir).parent if self.run_dir else None
        return str(parent) if parent and (parent / SWEEP_FILE).exists() else ""

    @property
    def host(self) -> str:
        """Where it ran: its recorded host, else the node SLURM placed it on (a block whose node was lost before the
        job recorded anything: runner.launch.slurm.record_slurm_end); '' where neither is known."""
        host = self.identity.host if self.identity is not None else self.environment.get("hostname", "")
        return str(host or self.environment.get("slurm_node", ""))

    @property
    def timed_in(self) -> str:
        """The rounds it was timed in: its sweep's, on its host, in its cluster job (a SLURM or Ray block); a single
        run's are its own. Runs are paired round by round only where this is the same: round k of runs made apart
        names no common moment, whatever their hosts are called."""
        block = self.environment.get("slurm_job_id") or self.environment.get("ray_job_id") or ""
        return "|".join((self.sweep or self.where, self.host, str(block)))

    @property
    def is_control(self) -> bool:
        """The control its sweep timed beside its jobs: measured, but no configuration of the sweep's answer."""
        return self.tags.get(IS_CONTROL_TAG) == "true"

    @property
    def timed(self) -> bool:
        """Finished with a timing: what a comparison or a history can use."""
        median = self.metrics.get("time_median_s")
        return self.status == Status.FINISHED and median is not None and not math.isnan(float(median))

    @property
    def typical_s(self) -> float:
        """Its typical time (each turn's fastest block, median over rounds; runner.report.comparison)."""
        return float(self.metrics.get("time_typical_s", math.nan))

    @property
    def version(self) -> str:
        """What it ran with: 'torch 2.14.1 @ 0f5a11b2c3'."""
        env = self.environment
        framework = f"{env.get('framework', '')} {env.get('framework_version', '')}".strip()
        commit = str(env.get("git_commit") or "")
        return f"{framework} @ {commit[:10]}" if commit and commit != "unknown" else framework


def from_dir(run_dir: Path) -> Run | None:
    """The run a directory holds (None where it holds no result.json); an unreadable record is a FAILED run saying
    why."""
    run_dir = Path(run_dir)
    if not Result.exists(run_dir):
        return None
    try:
        result = Result.load(run_dir)
    except ResultUnreadable as error:
        return Run(name=run_dir.name, status=Status.FAILED, identity=None, run_dir=str(run_dir), error=str(error))
    name = naming.run_name(result.config, *naming.job_context(run_dir)) if result.config else run_dir.name
    return Run(
        name=name,
        status=result.status,
        identity=result.identity(),
        params=naming.run_params(result.config, result.copied_keys),
        metrics=dict(result.metrics),
        environment={k: str(v) for k, v in result.environment.items()},
        run_dir=str(run_dir),
        started=result.started or 0.0,
        error=result.error,
        warnings=tuple(result.warnings),
        tags=control_tag(run_dir, result),
    )


def control_tag(run_dir: Path, result: Result) -> dict[str, str]:
    """Where its sweep timed a control (runner.launch.control): `is_control` on the run of the job the control added
    (its folder, not its case: a sweep's own job may do the same work), `control_case` (the control's case) on the
    others'. Its MLflow tags (tracking.upload) and its Run's."""
    control, found = control_of(run_dir), result.identity()
    if not (control and found):
        return {}
    own = Path(run_dir).name == control.get("folder", str(control.get("job")))
    return {IS_CONTROL_TAG: "true"} if own else {CONTROL_TAG: control["case"]}


def from_dirs(run_dirs: Iterable[Path]) -> list[Run]:
    """The runs of these directories, in their order (those without a result.json left out)."""
    return [run for run in (from_dir(Path(d)) for d in run_dirs) if run is not None]


def from_path(path: Path) -> list[Run]:
    """A run directory's run, or a sweep directory's jobs (runs_in)."""
    return from_dirs([path] if Result.exists(path) else runs_in(path))


def runs_in(sweep_dir: Path) -> list[Path]:
    """The job directories of a sweep (Hydra's numbered subdirectories), in job order."""
    dirs = [p.parent for p in Path(sweep_dir).glob(f"*/{RESULT_FILE}")]
    return sorted(dirs, key=lambda d: (not d.name.isdigit(), int(d.name) if d.name.isdigit() else 0, d.name))


def identity_from_record(
    params: dict[str, str], tags: dict[str, str], environment: dict[str, str], name: str
) -> Identity:
    """A run's identity as MLflow holds it (its tags), or, for a run recorded before they existed, computed from its
    params and environment, its case kept where it was tagged (the same key: a history goes on across the change).
    Params say an unset key as run_params does, so an old run's configuration matches only other old runs'."""
    found = Identity.from_tags(tags)
    if found is not None:
        return found
    computed = identity.of(params, environment, name.split(" #")[0])
    if tags.get("case"):
        computed = replace(computed, case=Key(tags["case"], tags.get("case_name") or computed.case.name))
    return computed

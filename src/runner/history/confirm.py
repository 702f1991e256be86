"""`runner history --fail-on LABELS --confirm`: before the gate fails, each flagged case runs again on the spot, and
its step stands only where the new run agrees with it.

The new run is the flagged case's newest run made again: its own recorded overrides (MLflow artifact
hydra/overrides.yaml), as a sweep of that one job, so that the control its sweep named (`control=NAME`) is timed
beside it in the same rounds, into the same store and experiment. It confirms the step where it lies nearer the level
after the step than the level before it: its time (relative to its control where the history was fitted so) over the
level before the step is beyond the step's geometric midpoint, sqrt(after / before). The level before is the one the
step's own ratio is measured from: the detector's (runner.history.steps: its runs weighted, a stray one pulled in).
The runs before the step are many and its after side is what a noisy night moves; one quiet re-run that lands back on
the old level clears it. TorchBench files only the regressions it reproduces; Otava adds a minimum segment length
against single spikes.

The re-run is tagged `history.confirms` (the flagged run's id), the flagged run `history.confirmed` (yes or no, with
the re-run's id and its ratio), so that the record says which alerts were confirmed. A step whose re-run could not be
made (no recorded overrides, or the case no longer runs) stands.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from runner.config import first_line
from runner.history.series import History
from runner.history.steps import Step
from runner.history.tags import CONFIRMED_TAG, CONFIRMS_TAG
from runner.locations import PROJECT_ROOT, output_root

# the re-run's own, not the record's: its store, its folder, and a profile of its call (timing.profile: what the
# history page's diff across the step reads, against a profiled run before the step)
OWN_KEYS = ("tracking.uri", "tracking.experiment", "hydra.sweep.", "hydra.run.", "timing.profile")
INTERRUPTED_WAIT_S = 30.0  # how long an interrupted re-run may take to close its runs before it is killed
SEARCHPATH = "hydra.searchpath="  # configs of one's own (a model of one's own): the re-run finds them as the run did


@dataclass(frozen=True)
class Confirmation:
    """A flagged step and what its re-run said."""

    case_name: str
    flagged_run: str  # the newest run of the case, whose configuration ran again
    rerun: str  # the re-run's MLflow run id ('' where it did not finish)
    ratio: float  # the re-run's time over the level before the step (NaN where it did not finish)
    midpoint: float  # sqrt(the step's ratio): beyond it, the re-run sits nearer the level after the step
    confirmed: bool
    why: str = ""  # where the re-run did not finish: its error

    @property
    def stands(self) -> bool:
        """Whether the step fails the gate: confirmed, or its re-run could not be made (a case that no longer runs is
        no reason to pass)."""
        return self.confirmed or not self.rerun

    def line(self) -> str:
        """'confirmed by a re-run (run 3f2a…): 1.48x the level before the step, beyond the midpoint 1.22x'."""
        if not self.rerun:
            return f"the re-run did not finish ({self.why}): the step stands"
        word = "confirmed" if self.confirmed else "not confirmed"
        side = "beyond" if self.confirmed else "short of"
        return (
            f"{word} by a re-run (run {self.rerun[:12]}): {self.ratio:.3g}x the level before the step, {side} the "
            f"midpoint {self.midpoint:.3g}x"
        )


def confirm(uri: str, flagged: list[tuple[History, list[Step]]], out=sys.stderr) -> list[Confirmation]:
    """Re-run each flagged case's newest run once and say whether it confirms each of its flagged steps (see the
    module's docstring), each re-run's progress on `out`; the record tagged as it says, and each flagged history's
    newest run given the word its tag holds."""
    from runner import tracking

    found = []
    for history, steps in flagged:
        newest = history.entries[-1].run_id
        print(f"re-running {history.case_name} (run {newest[:12]}) to confirm its step", file=out, flush=True)
        rerun, value, why = _rerun(uri, newest, history.relative)
        found += [judged(history.case_name, step, newest, rerun, value, why) for step in steps]
        if rerun:
            tracking.set_tags(uri, rerun, {CONFIRMS_TAG: newest})
        said = "; ".join(c.line() for c in found[-len(steps) :])
        word = f"{'yes' if found[-1].stands else 'no'}: {said}"
        tracking.set_tags(uri, newest, {CONFIRMED_TAG: word})
        history.entries[-1] = replace(history.entries[-1], confirmed=word)  # as the store holds it now
    return found


def judged(case_name: str, step: Step, flagged: str, rerun: str, value: float, why: str = "") -> Confirmation:
    """What a re-run (its MLflow run id, '' where it did not finish) whose time, or time over its control's where the
    history was fitted so, is `value` says of `step`: its ratio to the level before the step, the detector's own level
    that the step's ratio is measured from (Step.before), beyond the step's geometric midpoint or short of it."""
    midpoint, ratio = math.sqrt(step.ratio), value / step.before
    confirmed = bool(rerun) and (ratio >= midpoint if step.ratio > 1 else ratio <= midpoint)
    return Confirmation(case_name, flagged, rerun, ratio, midpoint, confirmed, why)


def _rerun(uri: str, run_id: str, relative: bool) -> tuple[str, float, str]:
    """(the re-run's MLflow run id, its time or its time over its control's, '') or ('', NaN, why it failed)."""
    from runner import tracking
    from runner.record.runs import from_path

    sweep_dir = output_root() / "outputs" / "confirm" / f"{time.strftime('%Y-%m-%d_%H-%M-%S')}_{run_id[:12]}"
    try:
        command = rerun_command(recorded_overrides(uri, run_id), uri, _experiment(uri, run_id), sweep_dir)
    except LookupError as error:
        return "", math.nan, str(error)
    done = _run_to_the_end(command)
    runs = from_path(sweep_dir) if sweep_dir.is_dir() else []
    case = [r for r in runs if not r.is_control and r.timed]
    control = [r for r in runs if r.is_control and r.timed]
    if done.returncode != 0 or not case or (relative and not control):
        lines = (done.stderr or done.stdout).strip().splitlines()
        return "", math.nan, lines[-1] if lines else f"exit {done.returncode}"
    rerun = tracking.read_link(Path(str(case[0].run_dir))).get("run_id", "")
    value = case[0].typical_s / control[0].typical_s if relative else case[0].typical_s
    return rerun, value, ""


def _run_to_the_end(command: list[str]) -> subprocess.CompletedProcess:
    """The re-run, waited for: on Ctrl-C the terminal interrupts it too, and it is given the time to close its runs
    (subprocess.run would kill it a quarter of a second later, its runs left RUNNING)."""
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=output_root()) as run:
        try:
            stdout, stderr = run.communicate()
        except KeyboardInterrupt:
            try:
                run.wait(timeout=INTERRUPTED_WAIT_S)
            except subprocess.TimeoutExpired:
                run.kill()
            raise
    return subprocess.CompletedProcess(command, run.returncode, stdout, stderr)


def rerun_command(overrides: list[str], uri: str, experiment: str, sweep_dir: Path) -> list[str]:
    """The flagged run made again: `run.py -m` (a sweep of one job, and its control where it names one) with its
    recorded overrides, into the same store and experiment, its folder `sweep_dir`, its call profiled after its
    timing (timing.profile: no timing includes the profiler)."""
    kept = [o for o in overrides if not o.lstrip("+~").startswith(OWN_KEYS)]
    entry = [sys.executable, str(PROJECT_ROOT / "run.py")] if (PROJECT_ROOT / "run.py").is_file() else ["tensor-runner"]
    own = [f"tracking.uri={uri}", f"tracking.experiment={experiment}", f"hydra.sweep.dir={sweep_dir}"]
    own.append("timing.profile=true")
    return [*entry, "-m", *kept, *own]


def recorded_overrides(uri: str, run_id: str) -> list[str]:
    """The overrides a run was made with, from its hydra/ artifacts (runner.tracking.upload logs its .hydra folder):
    its own (overrides.yaml), and where Hydra found configs of one's own (hydra.searchpath: in its hydra.yaml, or for
    a sweep's job, whose files are logged before Hydra writes that, in its sweep's multirun.yaml)."""
    from omegaconf import OmegaConf

    from runner.tracking.search import existing_run

    with tempfile.TemporaryDirectory() as folder:
        found = _artifact(uri, run_id, "hydra/overrides.yaml", folder)
        if found is None:
            raise LookupError(f"run {run_id} has no hydra/overrides.yaml artifact to run it again")
        own = [str(o) for o in _yaml(found, run_id)]
        hydra = _artifact(uri, run_id, "hydra/hydra.yaml", folder)
        parent = existing_run(uri, run_id).get_run(run_id).data.tags.get("mlflow.parentRunId")
        if hydra is None and parent:
            hydra = _artifact(uri, parent, "multirun.yaml", folder)
        searched = (OmegaConf.select(_yaml(hydra, run_id), "hydra.overrides.hydra") or []) if hydra else []
        return own + [str(o) for o in searched if str(o).startswith(SEARCHPATH)]


def _yaml(path: Path, run_id: str) -> Any:
    """An artifact of Hydra's read back; LookupError (one line) where it is not the YAML Hydra wrote."""
    from omegaconf import OmegaConf

    try:
        loaded = OmegaConf.load(path)
    except Exception as error:  # not text, not YAML (yaml's own errors), not what OmegaConf takes: one line each
        raise LookupError(f"run {run_id}: its hydra/{path.name} cannot be read ({first_line(error)})") from None
    if path.name == "overrides.yaml" and not OmegaConf.is_list(loaded):
        raise LookupError(f"run {run_id}: its hydra/overrides.yaml is not the list of overrides Hydra writes")
    return loaded


def _artifact(uri: str, run_id: str, path: str, folder: str) -> Path | None:
    """A run's artifact downloaded into `folder`, or None where it has none."""
    import mlflow.artifacts

    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")  # a bar per small file, on stderr
    try:
        return Path(
            mlflow.artifacts.download_artifacts(
                run_id=run_id, artifact_path=path, dst_path=f"{folder}/{run_id}", tracking_uri=uri
            )
        )
    except Exception:  # noqa: BLE001 - MLflow raises several kinds for a missing artifact
        return None


def _experiment(uri: str, run_id: str) -> str:
    from runner.tracking.search import existing_run

    mlflow = existing_run(uri, run_id)
    return mlflow.get_experiment(mlflow.get_run(run_id).info.experiment_id).name

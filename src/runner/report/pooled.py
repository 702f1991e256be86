"""A sweep's replicates pooled: each configuration against the fastest doing the same work (runner.report.sweep_answer
says it in words).

Runs of one configuration (runner.identity: every setting but the seed) are replicates: the same work with other
weights and inputs, each in its own process, on any node of one kind of machine. A configuration is compared as
runner.report.comparison compares a run (its replicates pooled round by round: Timings), with the fastest
configuration doing the same work as its baseline.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import numpy as np
import pandas as pd

from runner.identity import REPLICATE, under
from runner.record import naming
from runner.record.naming import TIMED_GROUPS
from runner.report.comparison import Comparison, Verdict, versus_fastest
from runner.report.frames import (
    param_cell,
    same_work,
    short_name,
    timed_runs,
    timings,
    varied_params,
    work_keys,
)
from runner.report.timings import Timings
from runner.tasks import Task, task_class

BARE = ("params.dtype",)  # keys shown as their value alone, as group choices (`backend.name`) are


@dataclass(frozen=True)
class Pooled:
    """One configuration of a sweep, its replicates pooled, against the fastest doing the same work."""

    workload: str  # the work it did, where the sweep did more than one ("" otherwise)
    label: str  # what varied, seed aside: "torch", "torch · function"
    key: str  # the label as an MLflow metric name's prefix: "torch", "torch_function"
    runs: int  # replicates pooled
    time_s: float  # typical time per call: the geometric mean of its replicates' typical times
    comparison: Comparison  # against the fastest configuration doing the same work
    busy: float = 0.0  # other runnable threads while timed, on average over its replicates
    unit: str = Task.unit  # one call of the task it timed, in words (runner.tasks.Task.unit): "a step"
    part: str = ""  # where the task times parts of a call too (Task.part), one in words: "a token"
    part_s: float = math.nan  # ... and their median time, over its replicates
    figures: tuple[tuple[str, str], ...] = ()  # the task's own columns (Task.metrics_shown): (heading, median cell)
    call: str = ""  # what one call is where the unit alone does not say it (Task.one_call)
    timed: str = ""  # what the runs timed where not the defaults: 'train_step (adam) on mlp' (naming.what_was_timed)
    nodes: int = 1  # the hosts its replicates ran on (a sweep blocked by node: each a block)
    versions: str = ""  # its Python environment's resolved set ('torch==2.13.0+cpu ...'), where it ran in another

    @property
    def ratio(self) -> float:
        return self.comparison.ratio

    @property
    def low(self) -> float:
        return self.comparison.low

    @property
    def high(self) -> float:
        return self.comparison.high

    @property
    def verdict(self) -> Verdict:
        return self.comparison.verdict

    @property
    def reason(self) -> str | None:
        return self.comparison.reason

    @property
    def is_fastest(self) -> bool:
        """The one of the lowest typical time, which the others are compared with (its verdict may be UNSTABLE)."""
        return self.comparison.is_baseline


def pool(frame: pd.DataFrame) -> list[Pooled]:
    """The finished, timed runs of `frame` grouped into configurations (replicates pooled), per workload in
    the order they came, fastest first within each."""
    if "is_control" in frame:  # the sweep's control (runner.launch.control) is measured, not compared in its answer
        frame = frame[~frame["is_control"].astype(bool)]
    frame = _own_environment_said(frame)
    timed = timed_runs(frame)
    if timed.empty:
        return []
    varied = [k for k in varied_params(frame) if not under(k.removeprefix("params."), REPLICATE)]
    several_setups = "setup" in frame and frame["setup"].nunique() > 1
    titled = [k for k in work_keys(frame) if k in varied] + (["setup"] if several_setups else [])
    shown = [k for k in varied if k not in work_keys(frame)]
    out: list[Pooled] = []
    said = what_was_timed(timed)
    for _, group in timed.groupby(same_work(timed), sort=False):
        configs = [runs for _, runs in group.groupby("configuration", sort=False)]
        found = versus_fastest([timings(c) for c in configs], [_key(c.iloc[0], varied) for c in configs])
        pooled = [
            Pooled(
                workload=_workload(group.iloc[0], titled),
                label=_label(runs.iloc[0], shown),
                key=_key(runs.iloc[0], varied),
                runs=len(runs),
                time_s=timings(runs).typical_s(),
                comparison=c,
                busy=timings(runs).busy,
                **_presented(runs),
                timed=said,
                nodes=int(runs["host"].nunique()) if "host" in runs else 1,
                versions=_text(runs.iloc[0].get("env.python_environment_versions")),
            )
            for runs, c in zip(configs, found, strict=True)
        ]
        out += sorted(pooled, key=lambda p: (not p.is_fastest, not p.comparison.ranked, p.ratio))
    return out


def _own_environment_said(frame: pd.DataFrame) -> pd.DataFrame:
    """The runner's own Python environment as `with=[]` where others' runs are beside it (its runs have no such param:
    runner.identity.environment_applies), so that the two are configurations of their own, each with its label."""
    column = "params.environment.with"
    if column not in frame or frame[column].isna().all():
        return frame
    return frame.assign(**{column: frame[column].fillna("[]")})


def _text(value: object) -> str:
    return "" if value is None or (isinstance(value, float) and math.isnan(value)) else str(value)


def what_was_timed(frame: pd.DataFrame) -> str:
    """The task, optimizer, model and precision the runs share, where not the defaults: 'train_step (adam) on mlp'."""
    fixed = {}
    for group in TIMED_GROUPS:  # an optimizer's params only where the task reads it (runner.identity.applies)
        values = frame[f"params.{group}.name"].dropna().map(str).unique() if f"params.{group}.name" in frame else []
        if len(values) == 1:
            fixed[group] = values[0]
    return naming.what_was_timed(fixed)


def _presented(runs: pd.DataFrame) -> dict:
    """How the runs' task says its times (runner.tasks.Task): its unit, what one call is, its own figures (the
    median over the replicates) and a part's time where it has one: its typical time where the parts are here
    (part_typical_s), else the median of its metric."""
    first = runs.iloc[0]
    task = task_class(first.get("params.task._target_"), first.get("params.task.name"))
    typical = part_typical_s(timings(runs)) if task.part is not None else None
    said: dict = {"unit": task.unit, "call": task.one_call(_settings(first)), "figures": _figures(task, runs, typical)}
    if task.part is not None:
        metric, part = task.part
        column = f"metrics.{metric}"
        if typical is not None:
            said.update(part=part, part_s=typical)
        elif column in runs and runs[column].notna().any():
            said.update(part=part, part_s=float(runs[column].median()))
    return said


def part_typical_s(found: Timings) -> float | None:
    """A part's typical time (a token's): the median over blocks of consecutive parts of each block's fastest, paired
    by round and position over the replicates (Timings.part_rounds), what a ratio 'a token' compares. The median of
    every part (tpot_p50_s) counts the parts that lost their core: on a busy machine numpy's read 32 ms a token beside
    its 0.17x of jax's 10.6 ms (issue 77). None where the parts are not here."""
    rounds = found.part_rounds()
    return float(np.median(rounds[0])) if rounds is not None and len(rounds[0]) else None


TYPICAL = "typical"  # said beside a part's figure where it is the typical time, not its metric's median


def _figures(task: type[Task], runs: pd.DataFrame, part_s: float | None = None) -> tuple[tuple[str, str], ...]:
    """The task's columns the terminal shows (Metric.in_terminal), each the median over the replicates, as the job
    table writes it; the part's own (a token's) its typical time `part_s` where given, headed so."""
    from runner.record.table import COLUMNS

    cells = {c.key: c for c in COLUMNS}
    found = []
    for metric in task.metrics_shown:
        column = f"metrics.{metric.key}"
        if task.part is not None and metric.key == task.part[0] and part_s is not None:
            found.append((f"{metric.heading} ({TYPICAL})", cells[metric.key].cell({metric.key: part_s})))
        elif metric.in_terminal and column in runs and runs[column].notna().any():
            found.append((metric.heading, cells[metric.key].cell({metric.key: float(runs[column].median())})))
    return tuple(found)


def _settings(row: pd.Series) -> dict:
    """A run's settings as nested as its config ({'model': {'prompt_len': 16}, 'batch_size': 32}), from its
    `params.*` columns."""
    nested: dict = {}
    for key, value in row.items():
        if not str(key).startswith("params.") or (isinstance(value, float) and math.isnan(value)):
            continue
        *groups, name = str(key).removeprefix("params.").split(".")
        level = nested
        for group in groups:
            level = level.setdefault(group, {}) if isinstance(level.get(group, {}), dict) else {}
        level[name] = param_cell(value)
    return nested


def _workload(row: pd.Series, keys: list[str]) -> str:
    return " · ".join(setting_text(k, row[k]) for k in keys)


def _label(row: pd.Series, keys: list[str]) -> str:
    return " · ".join(setting_text(k, row[k]) for k in keys) or "all runs"


def setting_text(key: str, value: object) -> str:
    """'torch' for a group's choice or a dtype, 'threads=2' for a plain key, 'setup 2' for a setup."""
    if key == "setup":
        return f"setup {value}"
    if key.endswith(".name") or key in BARE:
        return param_cell(value)
    return f"{short_name(key).rsplit('.', 1)[-1]}={param_cell(value)}"


def _key(row: pd.Series, keys: list[str]) -> str:
    """A configuration as an MLflow metric name's prefix (letters, digits, _ . -): 'torch_function', 'numpy_n64'."""
    parts = [setting_text(k, row[k]).replace("=", "") for k in keys] or ["all"]
    return re.sub(r"[^\w.\-]", "-", "_".join(parts))

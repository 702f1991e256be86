"""Where a run ran and with what: runs are ranked against each other only within one setup.

A setup is a kind of machine (runner.identity.machine: CPU model and cores, memory, GPUs, driver branch; never the
host) and the versions the run used (Python, the runner's commit and whether it had uncommitted changes, the
framework's version). Runs of one sweep share it, and so do the runs of a sweep sent to several nodes of one kind:
their nodes are replicates, ranked together. An MLflow experiment gathered over months, or runs on two kinds of
machine, may not: two runs of different setups differ by more than the work they did, so `runner report` and a
sweep's table compare each run only with runs of its own setup, and say what sets the others apart. Across setups
the question is a before/after one: `runner compare` (runner.report.before_after).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from runner.identity import MACHINE, machine_facts
from runner.record.result import Status

if TYPE_CHECKING:  # pandas only where frames are built: a job records and uploads its setup without it
    import pandas as pd

# environment key -> how a person reads it; all of them must agree for two runs to share a setup
VERSIONS = {"python": "Python", "git_commit": "runner commit", "git_dirty": "uncommitted changes"}
FRAMEWORK = ("framework", "framework_version")  # one version per framework within a setup
MACHINE_SAID = {"cpu": "CPU", "memory_gib": "memory (GiB)", "gpus": "GPUs", "speed_variables": "environment"}
COLUMNS = tuple(f"env.{k}" for k in (*MACHINE, *VERSIONS, *FRAMEWORK))
# A run in another Python environment (environment.*, runner.launch.environments): its versions are its
# configuration's, compared within a setup as any setting is, and named in words by the sweep's answer
PYTHON_ENVIRONMENT = ("python_environment", "python_environment_versions")


def environment_columns(environment: dict) -> dict[str, str]:
    """A run's setup as frame columns (env.cpu, env.python, ...) from its recorded environment; '' where unknown.
    The host is a column too (env.hostname), shown, never compared."""
    facts = machine_facts(environment) if environment else dict.fromkeys(MACHINE, "")
    columns = {f"env.{k}": v for k, v in facts.items()}
    columns["env.hostname"] = str(environment.get("hostname", ""))
    columns.update({f"env.{k}": str(environment.get(k, "")) for k in (*VERSIONS, *FRAMEWORK, *PYTHON_ENVIRONMENT)})
    return columns


def setups(frame: pd.DataFrame) -> pd.Series:
    """Per run, the number of its setup (1, 2, ...: in order of first appearance; NaN for a run that recorded
    no environment, refused before it ran, or that ended before it recorded its machine: _never_read). Runs share a
    setup when their kind of machine (the `machine` column, runner.identity) and versions agree
    and, where a framework appears in several versions, they used the same one: the runs of its second version
    form a setup of their own, with the other frameworks' runs of the first."""
    import pandas as pd

    if frame.empty or not {"machine", *COLUMNS} <= set(frame):
        return pd.Series(1, index=frame.index)
    recorded = frame["machine"].notna() & ~_never_read(frame)  # a job refused before it ran recorded no environment
    versions = frame[[f"env.{k}" for k in VERSIONS]].astype(str)
    own = _in_own_environment(frame)
    ours = versions.loc[own & recorded, "env.python"]  # another environment's Python is its configuration's: ours
    versions.loc[~own, "env.python"] = ours.mode().iloc[0] if len(ours) else ""
    base = frame["machine"].astype(str) + "|" + versions.agg("|".join, axis=1)
    nth_version = pd.Series(0, index=frame.index)
    for _, runs in frame[own].groupby([base[own], frame.loc[own, "env.framework"]], sort=False):
        versions = list(dict.fromkeys(runs["env.framework_version"]))
        nth_version[runs.index] = runs["env.framework_version"].map(versions.index)
    key = base + "#" + nth_version.astype(str)
    order = list(dict.fromkeys(key[recorded]))
    return key.map(lambda k: order.index(k) + 1 if k in order else None).where(recorded).astype(float)


def _never_read(frame: pd.DataFrame) -> pd.Series:
    """Per run, whether it did not finish and recorded no fact of its machine: a job SLURM ended before it recorded
    anything (a block whose node was lost), its record the cluster's reason, its job id and node alone. Its CPU was
    never read, not unknown: it is in no setup, and its row says where it was (its host, else its node) and that it
    failed, as any run's does."""
    import pandas as pd

    if "status" not in frame:
        return pd.Series(False, index=frame.index)
    facts = frame[[f"env.{k}" for k in MACHINE]].fillna("").astype(str)
    return (frame["status"] != Status.FINISHED) & (facts == "").all(axis=1)


def _in_own_environment(frame: pd.DataFrame) -> pd.Series:
    """Per run, whether it ran in the runner's own Python environment (not in environment.*'s)."""
    column = "env.python_environment"
    if column not in frame:
        return frame["machine"].notna() | frame["machine"].isna()
    return frame[column].fillna("").astype(str).isin(("", "nan"))


def describe(frame: pd.DataFrame, numbers: pd.Series) -> list[str]:
    """One line per setup after the first, saying how it differs from setup 1 (empty with one setup)."""
    if numbers.nunique() < 2:
        return []
    first = frame[numbers == 1]
    lines = []
    for number in sorted(numbers.dropna().unique())[1:]:
        runs = frame[numbers == number]
        lines.append(f"setup {int(number)}: {differences(first, runs, 'setup 1')}; ranked only within its own setup")
    return lines


def differences(before: pd.DataFrame, after: pd.DataFrame, before_name: str = "before") -> str:
    """What sets the runs of `after` apart from those of `before`: 'CPU AMD EPYC 9654 (before: AMD EPYC 7B13)',
    'torch 2.15.0 (before: 2.14.1)'; 'the same kind of machine and versions' where nothing does (and on which hosts,
    where they differ: where the runs ran, not what sets them apart)."""
    said = []
    for key, name in {**{k: MACHINE_SAID.get(k, v or k) for k, v in MACHINE.items()}, **VERSIONS}.items():
        was, now = _values(before, key), _values(after, key)
        if was != now:
            said.append(f"{name} {', '.join(now) or 'unknown'} ({before_name}: {', '.join(was) or 'unknown'})")
    frameworks = set(_values(before, "framework")) & set(_values(after, "framework"))
    for framework in sorted(frameworks):
        was = _values(before[before["env.framework"] == framework], "framework_version")
        now = _values(after[after["env.framework"] == framework], "framework_version")
        if was != now:
            said.append(f"{framework} {', '.join(now)} ({before_name}: {', '.join(was)})")
    if said:
        return "; ".join(said)
    hosts_was, hosts_now = _values(before, "hostname"), _values(after, "hostname")
    if hosts_was != hosts_now:  # where they ran, not what sets them apart
        hosts = f"{', '.join(hosts_now)} ({before_name}: {', '.join(hosts_was)})"
        return f"the same kind of machine and versions, on hosts {hosts}"
    return "the same kind of machine and versions"


def _values(runs: pd.DataFrame, key: str) -> list[str]:
    column = f"env.{key}"
    return sorted({v for v in runs[column].map(str) if v and v != "nan"}) if column in runs else []

"""`runner bisect`: the first release of a package that made a job slower, by binary search over same-round A/B
sweeps. Hermetic: plantpkg's releases are written here (tests/wheel_maker.py), one of them with a planted step."""

from __future__ import annotations

import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from wheel_maker import write_wheel

from runner.config import PROJECT_ROOT
from runner.launch import environments

PLUGIN = Path(__file__).parent / "plugin"
RELEASES = [f"1.{i}" for i in range(8)]
STEP = "1.5"  # from this release on plantpkg's job runs twice the layers: found on a busy machine too


@pytest.fixture(scope="module")
def wheels(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("wheels")
    for version in RELEASES:
        extra = 1.0 if version >= STEP else 0.0
        write_wheel(
            folder, "plantpkg", version, {"plantpkg/__init__.py": f"VERSION = {version!r}\nEXTRA_WORK = {extra}\n"}
        )
    return folder


def _bisect(tmp: Path, *args: str) -> subprocess.CompletedProcess:
    environ = {
        **os.environ,
        environments.CACHE_VARIABLE: str(tmp / "environments"),
        "PYTHONPATH": os.pathsep.join([str(PLUGIN), str(PROJECT_ROOT / "src")]),
    }
    return subprocess.run(
        [sys.executable, "-m", "runner", "bisect", *args], env=environ, capture_output=True, text=True, timeout=900
    )


def test_each_probe_is_a_sweep_nested_under_one_mlflow_run_of_the_bisection(tmp_path, wheels):
    """End to end, as a user runs it; its verdicts are timings on this machine, so only their form is checked here
    (the search on known verdicts below, its findings on real timings in BENCHMARKS.md)."""
    from mlflow.tracking import MlflowClient

    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    job = [
        "backend=numpy",
        "model=plant",
        "task=inference",
        f"tracking.uri={store}",
        "timing.max_time_s=1",
        "threads=1",
    ]
    job.append(f"hydra.searchpath=[file://{PLUGIN / 'conf'}]")
    out = _bisect(tmp_path, "plantpkg==1.0", "plantpkg==1.7", "--find-links", str(wheels), "--out", str(tmp_path / "b"),
                  "--", *job)  # fmt: skip
    assert out.returncode in (0, 1), out.stdout[-3000:] + out.stderr[-3000:]
    lines = out.stdout.strip().splitlines()
    assert lines[0] == f"bisect plantpkg: 8 candidates from 1.0 to 1.7, sweeps in {tmp_path / 'b'}"
    verdicts = [line for line in lines if re.match(r"probe \d+: plantpkg \S+ → \S+: \S+x", line)]
    assert verdicts and verdicts[0].startswith("probe 1: plantpkg 1.0 → 1.7: ")
    if out.returncode == 0:
        assert re.fullmatch(r"first slower: plantpkg 1\.\d \(\S+x \[\S+\] against 1\.\d\)", lines[-1]), out.stdout
    client = MlflowClient(store)
    runs = client.search_runs(client.get_experiment_by_name("tensor-runner").experiment_id)
    bisection = [r for r in runs if r.data.tags.get("mlflow.runName", "").startswith("bisect ")]
    assert len(bisection) == 1 and bisection[0].data.tags["verdict"] == lines[-1]
    probes = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == bisection[0].info.run_id]
    assert len(probes) == len(verdicts) == len(list((tmp_path / "b").glob("probe-*")))


def _known(step: str, unresolved: tuple[tuple[str, str], ...] = ()):
    """A probe that calls `after` slower exactly where the step lies between the two (no interval for the pairs in
    `unresolved`), as timings that always resolve would."""
    from runner.launch.bisect import Probe

    def probe(package, pair, overrides, find_links, threshold, folder):
        before, after = pair
        if (before.name, after.name) in unresolved:
            return Probe(before, after, 1.5, math.nan, math.nan, False, folder)
        slower = float(before.name) < float(step) <= float(after.name)
        return Probe(before, after, 1.05 if slower else 1.0, 1.03 if slower else 0.98, 1.07 if slower else 1.02,
                     slower, folder)  # fmt: skip

    return probe


@pytest.mark.parametrize("step", [f"1.{i}" for i in range(1, 10)])
def test_the_search_finds_the_step_in_at_most_ceil_log2_n_plus_2_probes(monkeypatch, tmp_path, step):
    from runner.launch import bisect

    found = [bisect.Candidate(f"plantpkg==1.{i}", f"1.{i}") for i in range(10)]
    monkeypatch.setattr(bisect, "probe", _known(step))
    first, made = bisect.search("plantpkg", found, [], None, 0.02, tmp_path, say=lambda line: None)
    assert first is not None and first.after.name == step and first.before.name == f"1.{int(step[2]) - 1}"
    assert len(made) <= math.ceil(math.log2(len(found))) + 2
    line = bisect.report("plantpkg", first, found, 0.02)
    assert line == f"first slower: plantpkg {step} (1.05x [1.03–1.07] against 1.{int(step[2]) - 1})"


def test_the_search_finds_nothing_where_bad_is_not_slower_than_good(monkeypatch, tmp_path):
    from runner.launch import bisect

    found = [bisect.Candidate(f"plantpkg==1.{i}", f"1.{i}") for i in range(8)]
    monkeypatch.setattr(bisect, "probe", _known("9.9"))
    first, made = bisect.search("plantpkg", found, [], None, 0.02, tmp_path, say=lambda line: None)
    assert first is None and len(made) == 1
    assert (
        bisect.report("plantpkg", first, found, 0.02)
        == "no release of plantpkg from 1.0 to 1.7 is slower by 2% or more"
    )


def test_a_probe_that_cannot_tell_is_timed_again_and_the_search_keeps_its_own_evidence(monkeypatch, tmp_path):
    from runner.launch import bisect

    found = [bisect.Candidate(f"plantpkg==1.{i}", f"1.{i}") for i in range(8)]
    monkeypatch.setattr(bisect, "probe", _known("1.5", unresolved=(("1.4", "1.5"),)))
    said: list[str] = []
    first, made = bisect.search("plantpkg", found, [], None, 0.02, tmp_path, say=said.append)
    assert first is not None and first.after.name == "1.5" and first.before.name == "1.3"  # the search's own probe
    assert sum("cannot tell (no interval); timing it again" in line for line in said) == 1


@pytest.mark.parametrize(
    ("bounds", "said"),
    [
        (["plantpkg==1.0", "numpy==2.4.6"], "GOOD and BAD name two packages (plantpkg, numpy)"),
        (["plantpkg==1.5", "plantpkg==1.2"], "GOOD (1.5) must be an earlier release than BAD (1.2)"),
        (["plantpkg==1.0", "plantpkg==9.9"], "plantpkg==9.9 is not offered by the indexes or find-links"),
        (["plantpkg>=1.0", "plantpkg==1.2"], "plantpkg>=1.0 must name one release (pkg==X)"),
        (["plantpkg==1.0", "plantpkg==1.2", "backend=nope"], "backend=nope is not an option (allowed backend: jax,"),
    ],
)
def test_bad_bounds_are_refused_in_one_line(tmp_path, wheels, bounds, said):
    """A bad job too (before: its first probe was announced and started before run.py refused it)."""
    good, bad, *job = bounds
    out = _bisect(tmp_path, good, bad, "--find-links", str(wheels), "--out", str(tmp_path / "b"), "--",
                  *(job or ["backend=numpy"]))  # fmt: skip
    assert out.returncode == 2, out.stdout + out.stderr
    assert out.stderr.strip().splitlines()[0].startswith(f"error: runner bisect: {said}"), out.stderr
    assert len(out.stderr.strip().splitlines()) == 1 and not out.stdout and not (tmp_path / "b").exists()


def test_commits_between_two_of_a_repository_are_the_candidates(tmp_path):
    from runner.launch.bisect import candidates

    repo = tmp_path / "repo"
    commits = []
    for number in range(4):
        (repo / "plantpkg").mkdir(parents=True, exist_ok=True)
        (repo / "plantpkg" / "__init__.py").write_text(f"VERSION = '{number}'\n")
        if number == 0:
            subprocess.run(["git", "init", "-q", str(repo)], check=True)
        git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t"]
        subprocess.run([*git, "add", "."], check=True)
        subprocess.run([*git, "commit", "-qm", f"release {number}"], check=True)
        commits.append(subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip())
    url = f"git+file://{repo}"
    package, found = candidates(f"plantpkg @ {url}@{commits[0]}", f"plantpkg @ {url}@{commits[3]}", None)
    assert package == "plantpkg" and [c.name for c in found] == [c[:12] for c in commits]
    assert found[2].requirement == f"plantpkg @ {url}@{commits[2]}"
    with pytest.raises(ValueError, match="is not an earlier commit"):
        candidates(f"plantpkg @ {url}@{commits[3]}", f"plantpkg @ {url}@{commits[0]}", None)


def test_the_lock_gate_compares_the_pins_that_changed():
    import importlib.util

    spec = importlib.util.spec_from_file_location("lock_gate", PROJECT_ROOT / "scripts" / "lock_gate.py")
    assert spec is not None and spec.loader is not None
    gate = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gate)
    base = gate.pins("numpy==2.4.1\ntorch==2.13.0 ; sys_platform == 'linux'\nscipy==1.17.1\nold-only==1.0\n")
    head = gate.pins("numpy==2.4.6\ntorch==2.14.1\nScipy==1.17.1\nnew_only==2.0\n")
    assert gate.changed(base, head) == (["numpy==2.4.1", "torch==2.13.0"], ["numpy==2.4.6", "torch==2.14.1"])
    assert gate.listed(["numpy==2.4.1", "torch==2.13.0"]) == "['numpy==2.4.1','torch==2.13.0']"

"""Python environments as a sweep axis (environment.*): each built once with uv over the runner's own, its jobs'
workers started from its interpreter and timed in the same rounds, and bad input refused in one line. Hermetic: the
package that differs, plantpkg, is written here as wheels (tests/wheel_maker.py) into a find-links folder; the rest
of each environment is the runner's own."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from helpers import identified, run_cli
from wheel_maker import write_wheel

from runner.config import PROJECT_ROOT, compose
from runner.identity import config_params
from runner.launch import environments
from runner.report import pooled, sweep_answer
from runner.spec import JobSpec

PLUGIN = Path(__file__).parent / "plugin"
RELEASES = {"1.0": 0.0, "2.0": 1.0}  # plantpkg's version -> its EXTRA_WORK: 2.0 runs twice the layers


@pytest.fixture(scope="module")
def wheels(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("wheels")
    for version, extra in RELEASES.items():
        code = f"VERSION = {version!r}\nEXTRA_WORK = {extra!r}\n"
        write_wheel(folder, "plantpkg", version, {"plantpkg/__init__.py": code})
    return folder


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> dict[str, str]:
    """The environment variables that keep this module's environments in a folder of its own."""
    folder = tmp_path_factory.mktemp("environments")
    return {environments.CACHE_VARIABLE: str(folder), "PYTHONPATH": f"{PLUGIN}{os.pathsep}{PROJECT_ROOT / 'src'}"}


JOB = ["-m", "backend=numpy", "model=plant", "task=inference", "tracking=none", "timing.max_time_s=1",
       f"hydra.searchpath=[file://{PLUGIN / 'conf'}]"]  # fmt: skip


def _sweep(sweep_dir: Path, cache: dict[str, str], *overrides: str, checkout: Path = PROJECT_ROOT):
    """`python CHECKOUT/run.py -m` of the plant job with `overrides`, as a user runs it, these variables added."""
    return run_cli(*JOB, f"hydra.sweep.dir={sweep_dir}", *overrides, env=cache, timeout=600, run_py=checkout / "run.py")


def test_two_releases_are_timed_in_one_sweep_each_in_its_environment(tmp_path, wheels, cache):
    asked = ["environment.with='plantpkg==1.0','plantpkg==2.0'", f"environment.find_links={wheels}"]
    out = _sweep(tmp_path / "sweep", cache, *asked)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "environment plantpkg==1.0: built in" in out.stderr
    records = [json.loads((tmp_path / "sweep" / n / "result.json").read_text()) for n in ("0", "1")]
    for record, version in zip(records, RELEASES, strict=True):
        env = record["environment"]
        assert env["plant_release"] == version  # the worker imported its environment's release
        assert env["python_environment_python"].startswith(cache[environments.CACHE_VARIABLE])
        assert f"plantpkg=={version}" in env["python_environment_versions"].split()
        assert env["python_environment_changes"] == f"plantpkg — → {version}"
    assert [r["environment"]["plant_layers"] for r in records] == ["100", "200"]
    work, configuration = ({r["identity"][k]["key"] for r in records} for k in ("work", "configuration"))
    assert len(work) == 1 and len(configuration) == 2  # the same work, two configurations: compared paired

    assert {r["environment"]["plant_runner_source"] for r in records} == {str(PROJECT_ROOT / "src")}

    other = _checkout_copy(tmp_path / "checkout")  # another checkout of the runner, the same environments' cache
    again = _sweep(tmp_path / "again", {**cache, "PYTHONPATH": str(PLUGIN)}, *asked, checkout=other)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "building" not in again.stderr and "resolving" not in again.stderr  # built once, then reused
    for number in ("0", "1"):  # its workers ran its own runner, not the one of the checkout that built them
        env = json.loads((tmp_path / "again" / number / "result.json").read_text())["environment"]
        assert env["plant_runner_source"] == str(other / "src")


def _checkout_copy(folder: Path) -> Path:
    """What run.py and the environments read of a checkout, copied: another checkout of the same code."""
    for name in ("run.py", "pyproject.toml", "requirements.lock"):
        folder.mkdir(parents=True, exist_ok=True)
        shutil.copy2(PROJECT_ROOT / name, folder / name)
    for name in ("conf", "src"):
        shutil.copytree(PROJECT_ROOT / name, folder / name, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    return folder


@pytest.mark.parametrize(
    ("overrides", "said"),
    [
        (["environment.with='plantpkg==9.9'"], "no version of plantpkg==9.9"),
        (["environment.with=['plantpkg==1.0','plantpkg==2.0']"], "plantpkg"),
        (["environment.python=/bin/true"], "environment.python=/bin/true is not a Python interpreter"),
        (["environment.with='plantpkg==1.0'", "environment.find_links=/no/such/folder"], "no such folder"),
        (["environment.with='plantpkg==1.0'", "isolation=inline"], "isolation=process"),
    ],
)
def test_bad_environments_are_refused_in_one_line(tmp_path, wheels, cache, overrides, said):
    asked = [o for o in overrides if not o.startswith("environment.find_links=")]
    out = _sweep(tmp_path / "sweep", cache, *asked, _links(overrides, wheels))
    assert out.returncode == 2, out.stderr[-2000:]
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and said in lines[0], out.stderr
    assert not (tmp_path / "sweep").exists()


def _links(overrides: list[str], wheels: Path) -> str:
    """The wheels' folder as find-links, unless the case gives its own."""
    given = [o for o in overrides if o.startswith("environment.find_links=")]
    return given[0] if given else f"environment.find_links={wheels}"


def test_an_interpreter_that_lacks_what_the_job_needs_is_refused(tmp_path, cache):
    bare = tmp_path / "bare"
    made = subprocess.run([environments._uv(), "venv", "-q", str(bare)], capture_output=True, text=True, check=False)
    assert made.returncode == 0, made.stderr
    out = _sweep(tmp_path / "sweep", cache, f"environment.python={bare / 'bin' / 'python'}")
    assert out.returncode == 2, out.stderr[-2000:]
    line = out.stderr.strip().splitlines()[-1]
    assert "lacks what the job needs: ModuleNotFoundError: No module named" in line, out.stderr
    assert "Traceback" not in out.stderr and not (tmp_path / "sweep").exists()


def test_the_environment_is_a_setting_of_the_configuration_only_where_it_is_not_the_runners_own():
    own = JobSpec.of(compose(["backend=numpy"]))
    other = JobSpec.of(compose(["backend=numpy", "environment.with='numpy==2.4.1'"]))
    listed = JobSpec.of(compose(["backend=numpy", "environment.with=['numpy==2.4.1']"]))
    assert not [k for k in config_params(own.config, own.copied_keys) if k.startswith("environment")]
    assert other.params()["environment.with"] == "['numpy==2.4.1']" == listed.params()["environment.with"]
    assert "environment.find_links" not in other.params()


@pytest.mark.parametrize(
    "stderr",
    [
        "  × No solution found when resolving dependencies:\n"
        "  ╰─▶ Because there is no version of plantpkg==9.9 and you require plantpkg==9.9, we can conclude that\n"
        "      your requirements are unsatisfiable.\n",
        "error: No solution found when resolving dependencies\n"
        "  cause: Because there is no version of plantpkg==9.9 and you require plantpkg==9.9, we can conclude that "
        "your requirements are unsatisfiable.\n",
    ],
)
def test_uvs_reason_is_one_line(stderr):
    assert environments._reason(stderr) == (
        "Because there is no version of plantpkg==9.9 and you require plantpkg==9.9, we can conclude that your "
        "requirements are unsatisfiable."
    )


def _two_releases(seconds: dict[str, float]) -> list[pooled.Pooled]:
    """A sweep's two configurations in environments that differ in plantpkg's release, `seconds` a call each, timed in
    the same 20 rounds of a machine whose speed moves from round to round."""
    rng = np.random.default_rng(0)
    phase, rounds = rng.normal(0, 0.1, 20), np.repeat(np.arange(1, 21), 5)
    rows = []
    for number, (version, time_s) in enumerate(seconds.items()):
        samples = time_s * np.exp(np.repeat(phase, 5) + rng.normal(0, 0.01, rounds.size))
        rows.append({
            "run": f"with={version} #{number}", "run_dir": f"/sweep/{number}", "status": "FINISHED",
            "params.model.name": "mlp", "params.task.name": "gradients", "params.batch_size": 32,
            "params.backend.name": "torch", "params.seed": 0,
            "params.environment.with": f"['torch=={version}']" if version != "own" else None,
            "env.python_environment": f"torch=={version}" if version != "own" else None,
            "env.python_environment_versions": f"numpy==2.4.6 torch=={version}" if version != "own" else None,
            "metrics.time_median_s": float(np.median(samples)), "metrics.machine_other_runnable": 0.1,
            "samples_s": samples, "sample_rounds": rounds, "size": np.nan, "size_name": None,
        })  # fmt: skip
    return pooled.pool(identified(pd.DataFrame(rows)))


def test_the_answer_names_the_release_that_changed_and_which_way():
    slower = sweep_answer.sentence(_two_releases({"2.13.0+cpu": 100e-6, "2.14.1": 104e-6}))
    newer = _two_releases({"2.13.0+cpu": 100e-6, "2.14.1": 104e-6})[1]
    said = f"torch 2.13.0+cpu → 2.14.1: {sweep_answer._ratio_said(newer)} {sweep_answer.interval_text(newer)} slower"
    assert slower.endswith(said), slower
    assert newer.ratio == pytest.approx(1.04, abs=0.01)
    faster = sweep_answer.sentence(_two_releases({"2.13.0+cpu": 104e-6, "2.14.1": 100e-6}))
    assert faster.endswith(" faster") and "torch 2.13.0+cpu → 2.14.1: 1.04x [" in faster, faster
    alike = sweep_answer.sentence(_two_releases({"2.13.0+cpu": 100e-6, "2.14.1": 100e-6}))
    assert alike.endswith(" within noise") and "torch 2.13.0+cpu → 2.14.1: " in alike, alike


def test_a_wheel_built_again_at_the_same_version_is_another_environment(tmp_path, monkeypatch):
    monkeypatch.setenv(environments.CACHE_VARIABLE, str(tmp_path / "environments"))
    settings = {"with": ["plantpkg==1.0"], "find_links": str(tmp_path / "wheels")}
    built = []
    for marker in ("first", "second"):
        path = write_wheel(tmp_path / "wheels", "plantpkg", "1.0", {"plantpkg/__init__.py": f"MARK = {marker!r}\n"})
        os.utime(path, (1_700_000_000 + len(built), 1_700_000_000 + len(built)))  # a rebuild, a second later
        monkeypatch.setattr(environments, "_READY", {})  # a new process
        environment = environments.ready(settings, say=lambda line: None)
        read = subprocess.run([environment.python, "-c", "import plantpkg; print(plantpkg.MARK)"], capture_output=True,
                              text=True, check=True)  # fmt: skip
        built.append((environment.python, read.stdout.strip()))
    assert built[0][1] == "first" and built[1][1] == "second" and built[0][0] != built[1][0]


def test_runs_in_other_environments_share_the_setup_of_the_runners_own():
    """Their framework (and Python) versions are their configuration's: compared, not ranked apart as two setups."""
    from runner import identity
    from runner.record import setups

    base = {"hostname": "x", "cpu": "EPYC", "cpu_count": 2, "memory_gib": 24, "python": "3.11", "git_commit": "x"}
    environments_ = [
        base | {"framework": "torch", "framework_version": "2.14.1"},
        base | {"framework": "torch", "framework_version": "2.13.0+cpu", "python_environment": "torch==2.13.0"},
        base | {"framework": "torch", "framework_version": "2.15.0", "python": "3.12", "python_environment": "x"},
        base | {"framework": "torch", "framework_version": "2.15.0"},  # the runner's own, upgraded: another setup
    ]
    rows = [{"machine": identity.machine(env).key, **setups.environment_columns(env)} for env in environments_]
    assert list(setups.setups(pd.DataFrame(rows))) == [1, 1, 1, 2]


def test_the_runners_own_environment_is_a_configuration_of_its_own_beside_others():
    found = _two_releases({"own": 100e-6, "2.13.0+cpu": 110e-6})
    assert [p.label for p in found] == ["with=[]", "with=['torch==2.13.0+cpu']"]


@pytest.mark.heavy
def test_a_users_interpreter_takes_a_release_over_its_own_packages(tmp_path, wheels, cache):
    """environment.python with environment.with: the release is laid over the user's interpreter, not the runner's."""
    user = tmp_path / "user"
    made = subprocess.run([environments._uv(), "venv", "-q", str(user)], capture_output=True, text=True, check=False)
    assert made.returncode == 0, made.stderr
    purelib = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    own = subprocess.run([sys.executable, "-c", purelib], capture_output=True, text=True, check=True).stdout.strip()
    theirs = subprocess.run([user / "bin" / "python", "-c", purelib], capture_output=True, text=True, check=True)
    Path(theirs.stdout.strip(), "what_the_job_needs.pth").write_text(f"{own}\n{PROJECT_ROOT / 'src'}\n")
    asked = [f"environment.python={user / 'bin' / 'python'}", "environment.with='plantpkg==2.0'"]
    out = _sweep(tmp_path / "sweep", cache, *asked, f"environment.find_links={wheels}")
    assert out.returncode == 0, out.stderr[-3000:]
    assert f"over {user / 'bin' / 'python'})" in out.stderr  # built over the user's interpreter
    env = json.loads((tmp_path / "sweep" / "0" / "result.json").read_text())["environment"]
    assert env["plant_release"] == "2.0" and env["plant_layers"] == "200"
    # uv lists no package a .pth file lends, so the runner's pinned set is laid over the bare venv beside the release
    changes = env["python_environment_changes"].split(", ")
    assert "plantpkg — → 2.0" in changes and f"numpy — → {np.__version__}" in changes
    assert env["python_environment_python"].startswith(cache[environments.CACHE_VARIABLE])

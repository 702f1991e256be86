"""Fixtures: compose configs in-process, run the CLI in a subprocess (the code is in helpers.py)."""

from __future__ import annotations

import multiprocessing.util
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import compose_config, run_cli

from runner.config import PROJECT_ROOT

# The modules that take longest in the default set (summed test seconds of `pytest --durations=0` on 2 cores), handed
# out first: pytest-xdist's --dist loadfile gives a worker the next file when it ends one, so a long file taken last
# runs alone while the other worker waits (addopts' --no-loadscope-reorder keeps this order, not one by test count).
LONGEST_FIRST = (
    "test_user_paths.py",
    "test_sweep.py",
    "test_transformer.py",
    "test_vision.py",
    "test_numerics.py",
    "test_lasting_record.py",
    "test_rounds.py",
    "test_nothing_lost.py",
    "test_jax.py",
    "test_config_errors.py",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    rank = {name: index for index, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: the rest keep their order


# What pytest and the linters keep at the root: written by the tools, not by a test.
TOOL_CACHES = {".pytest_cache", ".mypy_cache", ".ruff_cache", ".hypothesis", "__pycache__"}
CHECKOUT_BEFORE = pytest.StashKey[set[str]]()


def pytest_sessionstart(session: pytest.Session) -> None:
    if not hasattr(session.config, "workerinput"):  # pytest-xdist's controller, or a run without workers
        session.config.stash[CHECKOUT_BEFORE] = _checkout_entries()


def pytest_sessionfinish(session: pytest.Session) -> None:
    """A session that wrote into the checkout fails, naming what it wrote: each test writes under its own folders
    (a run's outputs/ and default store, a page or a report written to a relative path land in the checkout)."""
    before = session.config.stash.get(CHECKOUT_BEFORE, None)
    written = sorted(_checkout_entries() - before) if before is not None else []
    if written:
        print(f"\nthe tests wrote into the checkout: {', '.join(written[:20])}", file=sys.stderr)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def _checkout_entries() -> set[str]:
    """The names at the checkout's root and every path under outputs/ (where a run writes by default)."""
    found = {name for name in os.listdir(PROJECT_ROOT) if name not in TOOL_CACHES}
    for folder, _, files in os.walk(PROJECT_ROOT / "outputs"):
        found |= {os.path.relpath(os.path.join(folder, name), PROJECT_ROOT) for name in [".", *files]}
    return found


# A developer's shell may point MLflow at a team's server or experiment: the tests name their own stores.
MLFLOW_VARIABLES = ("MLFLOW_TRACKING_URI", "MLFLOW_EXPERIMENT_NAME", "MLFLOW_EXPERIMENT_ID", "MLFLOW_RUN_ID")


@pytest.fixture(scope="session", autouse=True)
def session_tmpdir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The session's temporary directory (TMPDIR), for module fixtures and the processes they start, removed at the
    end: nothing a killed run left in the shared one is seen, and torch's compiled kernels are shared by the session's
    tests only. A short path: a Unix socket's (multiprocessing's, Ray's) must fit in 107 bytes."""
    tmp_path_factory.getbasetemp()  # pytest's own folders stay where they were
    multiprocessing.util.get_temp_dir()  # this process's, cached and removed at exit: not in a folder removed earlier
    folder = Path(tempfile.mkdtemp(prefix="runner-tests-"))
    with pytest.MonkeyPatch.context() as patch:
        _point_tmpdir(patch, folder)
        patch.setenv("TORCHINDUCTOR_CACHE_DIR", str(folder / "torchinductor"))
        for name in MLFLOW_VARIABLES:
            patch.delenv(name, raising=False)
        yield folder
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(autouse=True)
def own_tmpdir(session_tmpdir: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The test's own temporary directory (TMPDIR, for it and the processes it starts), inside the session's: a test
    that checks what a run leaves there sees only its own. Kept until the session ends, as what this process cached
    in it (a store made once a session) is."""
    folder = Path(tempfile.mkdtemp(prefix="t-", dir=session_tmpdir))
    _point_tmpdir(monkeypatch, folder)
    return folder


def _point_tmpdir(patch: pytest.MonkeyPatch, folder: Path) -> None:
    patch.setenv("TMPDIR", str(folder))
    patch.setattr(tempfile, "tempdir", str(folder))  # gettempdir() caches what it found first


@pytest.fixture
def make_config():
    return compose_config


@pytest.fixture
def cli():
    return run_cli


@pytest.fixture(autouse=True)
def tensorflow_type_rules():
    """After a test that ran tnp in this process, TensorFlow's own dtype rules, as the next TensorFlow job sets them
    (runner.backends.tnp_precision): a test of TensorFlow or Keras without a job sees the rules it would alone."""
    yield
    import sys

    if "runner.backends.tnp_precision" in sys.modules:
        sys.modules["runner.backends.tnp_precision"].tensorflow_rules()

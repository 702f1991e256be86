"""Fixtures: compose configs in-process, run the CLI in a subprocess (the code is in helpers.py)."""

from __future__ import annotations

import pytest
from helpers import compose_config, run_cli

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

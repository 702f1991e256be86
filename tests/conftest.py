"""Fixtures: compose configs in-process, run the CLI in a subprocess (the code is in helpers.py)."""

from __future__ import annotations

import pytest
from helpers import compose_config, run_cli


@pytest.fixture
def make_config():
    return compose_config


@pytest.fixture
def cli():
    return run_cli

"""A task of one's own is two files: a runner.tasks.Task subclass and its yaml (tests/plugin/loss_task.py and
tests/plugin/conf/task/loss_value.yaml), found as a user's own model is: PYTHONPATH and hydra.searchpath."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from helpers import FAST_TIMING, compose_config, run_cli

from runner.config import ConfigError, check_combination

PLUGIN = Path(__file__).parent / "plugin"
SEARCHPATH = f"hydra.searchpath=[file://{PLUGIN / 'conf'}]"


@pytest.fixture
def plugin_on_path(monkeypatch):
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(PLUGIN), os.environ.get("PYTHONPATH", "")]))


def test_a_task_of_ones_own_runs_checked_against_its_reference(tmp_path, plugin_on_path):
    out = run_cli(SEARCHPATH, "task=loss_value", "backend=torch", "tracking=none", f"hydra.run.dir={tmp_path}",
                  *FAST_TIMING)  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    saved = json.loads((tmp_path / "result.json").read_text())
    assert saved["status"] == "FINISHED", saved.get("error")
    assert saved["metrics"]["max_rel_err_vs_reference"] < 1e-5  # its own reference, compared by the runner


def test_a_task_of_ones_own_is_refused_where_the_task_it_runs_like_is(monkeypatch):
    monkeypatch.syspath_prepend(str(PLUGIN))
    with pytest.raises(ConfigError, match="^model=matmul runs only task=inference, not task=loss_value$"):
        check_combination(compose_config(SEARCHPATH, "task=loss_value", "model=matmul"))


def test_a_target_that_is_no_task_is_refused_in_one_line():
    line = "^task._target_=collections.OrderedDict must be a subclass of runner.tasks.Task$"
    with pytest.raises(ConfigError, match=line):
        check_combination(compose_config("task._target_=collections.OrderedDict"))


def test_a_task_of_ones_own_that_is_refused_exits_with_one_line(tmp_path, plugin_on_path):
    out = run_cli(SEARCHPATH, "task=loss_value", "model=matmul", "tracking=none", f"hydra.run.dir={tmp_path}")
    assert out.returncode != 0
    assert "model=matmul runs only task=inference, not task=loss_value" in out.stderr
    assert "Traceback" not in out.stderr

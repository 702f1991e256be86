"""What a newcomer asks first: `python run.py --help`, `runner --version`, and which version made a record."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from importlib import metadata
from pathlib import Path

from helpers import run_cli, runner_cli

from runner.app import help_text
from runner.locations import CONFIG_DIR
from runner.measure.job import run_and_record
from runner.record.naming import job_spec

# Config groups that are not a user's choice: `variant` (named backend + mode pairs for the experiments' sweeps) must
# not be shown; Hydra's help and logging groups are chosen by conf/config.yaml.
INTERNAL_GROUPS = {"variant", "hydra/help", "hydra/hydra_logging", "hydra/job_logging"}
STORED_OPTIONS = {"hydra/launcher": {"rounds"}}  # in Hydra's ConfigStore (src/hydra_plugins/tensor_runner/), no file


def config_groups() -> dict[str, set[str]]:
    """Every config group of the app's configs (the checkout's conf/, or the wheel's: runner.locations) with its
    options: the folders holding yaml files, as Hydra finds them (conf/experiment is a link)."""
    groups: dict[str, set[str]] = {}
    for folder, _, files in os.walk(CONFIG_DIR, followlinks=True):
        options = {Path(name).stem for name in files if name.endswith(".yaml")}
        group = Path(folder).relative_to(CONFIG_DIR).as_posix()
        if options and group != ".":
            groups[group] = options | STORED_OPTIONS.get(group, set())
    return groups


def user_groups() -> dict[str, set[str]]:
    return {group: options for group, options in config_groups().items() if group not in INTERNAL_GROUPS}


def listed_options(text: str, group: str) -> set[str] | None:
    """The words on the help's line for `group` and its continuation lines; None where no line names it."""
    line = re.search(rf"^ *{re.escape(group)} +(.*(?:\n {{10,}}\S.*)*)", text, re.MULTILINE)
    return set(re.findall(r"[\w]+", line.group(1))) if line else None


def test_help_is_what_hydra_renders_from_the_same_template():
    """`--help` alone is answered from conf/hydra/help/ without Hydra; with an override beside it Hydra answers, from
    the same template: the two print the same text, and `-h` too."""
    own, short = run_cli("--help", timeout=120), run_cli("-h", timeout=120)
    hydras = run_cli("--help", "hydra.help.app_name=tensor-runner", timeout=120)
    assert own.returncode == short.returncode == hydras.returncode == 0, (own.stderr + hydras.stderr)[-2000:]
    assert own.stdout == short.stdout == hydras.stdout
    assert help_text(["--help", "backend=torch"]) is None and help_text(["--cfg", "job"]) is None


def test_run_py_help_is_the_apps_own_and_fits_on_a_screen():
    """Run in a fresh process, as a user types it: every user-facing group found in the config folders with all its
    options (a group or an option added there fails this test until the help names it), no internal one."""
    result = run_cli("--help", timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    text = result.stdout
    assert text.startswith("tensor-runner: ")
    assert len(text.splitlines()) <= 45
    assert {"backend", "model", "task", "experiment", "implementation", "hydra/launcher"} <= set(user_groups())
    for group, options in user_groups().items():
        named = listed_options(text, group)
        assert named is not None, f"the help does not list the group {group}"
        assert options <= named, f"{group}: the help leaves out {options - named}"
    assert "variant" not in text
    assert all(part in text for part in ("Examples:", "outputs/runs/", "mlflow.db", "--hydra-help"))
    assert "Powered by Hydra" not in text  # Hydra's default help, which lists `variant`'s 40 entries


def test_runner_version_is_the_installed_packages():
    expected = f"tensor-runner {metadata.version('tensor-runner')}"
    console_script = Path(sys.executable).with_name("runner")
    for result in (
        runner_cli("--version"),
        subprocess.run([str(console_script), "--version"], capture_output=True, text=True, timeout=120),
    ):
        assert result.returncode == 0, result.stderr[-2000:]
        assert result.stdout.strip() == expected


def test_a_run_records_the_tensor_runner_version(make_config, tmp_path):
    outcome = run_and_record(job_spec(make_config("tracking=none", "backend=numpy")), tmp_path)
    assert outcome.environment["tensor_runner"] == metadata.version("tensor-runner")
    saved = json.loads((tmp_path / "result.json").read_text())
    assert saved["environment"]["tensor_runner"] == metadata.version("tensor-runner")

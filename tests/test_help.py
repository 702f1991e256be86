"""What a newcomer asks first: `python run.py --help`, `runner --version`, and which version made a record."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from importlib import metadata
from pathlib import Path

from helpers import run_cli, runner_cli

from runner.config import PROJECT_ROOT
from runner.measure.job import run_and_record

# The config groups a user picks from, as the help lists them; `variant` (named backend + mode pairs for the
# experiments' sweeps) is internal and must not be shown.
USER_GROUPS = (
    "backend",
    "device",
    "model",
    "mode",
    "task",
    "precision",
    "data",
    "tracking",
    "experiment",
    "hydra/launcher",
)


def group_values(group: str) -> set[str]:
    return {path.stem for path in (PROJECT_ROOT / "conf" / group).glob("*.yaml")}


def test_run_py_help_is_the_apps_own_and_fits_on_a_screen():
    """Run in a fresh process, as a user types it: every user-facing group with all its values, no internal one."""
    result = run_cli("--help", timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    text = result.stdout
    assert text.startswith("tensor-runner: ")
    assert len(text.splitlines()) <= 45
    for group in USER_GROUPS:
        line = re.search(rf"^ *{re.escape(group)} +(.*(?:\n {{10,}}\S.*)*)", text, re.MULTILINE)
        assert line, f"the help does not list the group {group}"
        named = set(re.findall(r"[\w]+", line.group(1)))
        assert group_values(group) <= named, f"{group}: the help leaves out {group_values(group) - named}"
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
    outcome = run_and_record(make_config("tracking=none", "backend=numpy"), tmp_path)
    assert outcome.environment["tensor_runner"] == metadata.version("tensor-runner")
    saved = json.loads((tmp_path / "result.json").read_text())
    assert saved["environment"]["tensor_runner"] == metadata.version("tensor-runner")

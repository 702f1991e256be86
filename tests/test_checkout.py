"""The repository's root holds the project's own files: nothing a run, a test or a fuzz wrote (a history page, a plot)
is tracked beside README.md. tests/conftest.py checks that a test session writes nothing into the checkout."""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest

from runner.config import PROJECT_ROOT

ROOT_FILES = {
    ".gitignore",
    ".pre-commit-config.yaml",
    "BENCHMARKS.md",
    "CHANGELOG.md",
    "CONTRIBUTING.md",
    "LICENSE",
    "README.md",
    "mkdocs.yml",
    "pyproject.toml",
    "requirements.lock",
    "run.py",
    "setup.py",
    "setup.sh",
}
# Each named in README.md, CONTRIBUTING.md or docs/ as `NAME/`
ROOT_FOLDERS = {".ci", "benchmarks", "conf", "docs", "examples", "experiments", "outputs", "scripts", "src", "tests"}


def _tracked_at_root() -> set[str]:
    if shutil.which("git") is None or not (PROJECT_ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    listed = subprocess.run(["git", "ls-files"], cwd=PROJECT_ROOT, capture_output=True, text=True, check=True)
    return {path.split("/")[0] for path in listed.stdout.splitlines()}


def _not_the_projects(names: set[str]) -> set[str]:
    return names - ROOT_FILES - ROOT_FOLDERS


def test_the_root_tracks_only_the_projects_own_files():
    tracked = _tracked_at_root()
    assert not _not_the_projects(tracked), f"tracked at the repository's root: {sorted(_not_the_projects(tracked))}"
    assert _not_the_projects(tracked | {"index.html", "plot.png"}) == {"index.html", "plot.png"}
    assert not ROOT_FOLDERS - tracked and not ROOT_FILES - tracked  # the lists name nothing that has gone


def test_each_folder_at_the_root_is_named_in_the_docs():
    pages = [PROJECT_ROOT / "README.md", PROJECT_ROOT / "CONTRIBUTING.md", *(PROJECT_ROOT / "docs").glob("*.md")]
    text = "\n".join(page.read_text() for page in pages)
    unnamed = {name for name in ROOT_FOLDERS if not re.search(rf"`{re.escape(name)}/", text)}
    assert not unnamed, f"no page names {sorted(unnamed)}"

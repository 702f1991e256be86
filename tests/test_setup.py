"""setup.sh installs with uv from where pip would: scripts/uv_args.py turns `pip config list` into uv's options."""

from __future__ import annotations

import importlib.util
import subprocess

from runner.config import PROJECT_ROOT

LISTED = """\
:env:.cert='/etc/ssl/certs/ca-certificates.crt'
:env:.find-links='/opt/wheels'
global.constraint='/etc/xdg/pip/constraints.txt'
global.extra-index-url='file:///opt/pypi/simple file:///opt/pypi-more/simple'
global.index-url='https://mirror.example/simple'
"""


def _uv_args():
    spec = importlib.util.spec_from_file_location("uv_args", PROJECT_ROOT / "scripts" / "uv_args.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_pips_indexes_find_links_and_constraints_become_uvs_options(monkeypatch, capsys):
    uv_args = _uv_args()
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: subprocess.CompletedProcess(a, 0, LISTED, ""))
    monkeypatch.setattr("sys.argv", ["uv_args.py"])
    uv_args.main()
    assert capsys.readouterr().out.splitlines() == [
        *("--index-url", "https://mirror.example/simple"),
        *("--extra-index-url", "file:///opt/pypi/simple", "--extra-index-url", "file:///opt/pypi-more/simple"),
        *("--find-links", "/opt/wheels", "--constraint", "/etc/xdg/pip/constraints.txt"),
        *("--index-strategy", "unsafe-best-match"),  # pip's choice across its indexes, not the first index's
    ]
    monkeypatch.setattr("sys.argv", ["uv_args.py", "cert"])
    uv_args.main()
    assert capsys.readouterr().out == "/etc/ssl/certs/ca-certificates.crt\n"


def test_the_lock_pins_every_dependency_the_project_names():
    import tomllib

    from packaging.requirements import Requirement

    project = tomllib.loads((PROJECT_ROOT / "pyproject.toml").read_text())["project"]
    named = [Requirement(r).name for r in [*project["dependencies"], *project["optional-dependencies"]["test"]]]
    pinned = {line.split("==")[0].lower() for line in (PROJECT_ROOT / "requirements.lock").read_text().splitlines()}
    assert not [name for name in named if name.lower().replace("_", "-") not in pinned], "write the lock again (README)"

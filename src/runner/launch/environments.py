"""The Python environments a job's workers run in (environment.*), each built once with uv and then reused.

An environment is the runner's own pinned set (requirements.lock) with environment.with's requirements over it: uv
resolves the project's requirements and the override, preferring every version the lock pins, so that only what the
override needs moves (torch==2.13.0 takes torchvision 0.28.0 with it). It is built as a venv that holds only the
packages whose versions differ from its base interpreter's (the runner's own, or environment.python's), and reads the
rest, and the runner's source, from there (a .pth file): a one-package variant installs one package. Resolutions and
environments are cached (RUNNER_ENVIRONMENTS, default ~/.cache/tensor-runner/environments), an environment under
the hash of its interpreter, its resolved set and the find-links folders' wheels; the indexes, find-links and
constraints pip is configured with apply (scripts/uv_args.py's, as in set-up). Whatever cannot be resolved or built is
a ConfigError of one line.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from functools import cache
from pathlib import Path
from typing import Any

from runner.config import ConfigError, first_line
from runner.locations import FROM_CHECKOUT, PROJECT_ROOT
from runner.spec import PythonEnvironment, environment_settings, is_project_environment

CACHE_VARIABLE = "RUNNER_ENVIRONMENTS"
RECORD = "environment.json"
LOCK = PROJECT_ROOT / "requirements.lock"
PTH = "_tensor_runner_base.pth"
LAYOUT = 2  # what a built environment holds; 1 also held the source of the checkout that built it
PROBE_TIMEOUT_S = 300.0  # an interpreter's import of the runner and a framework, on a busy machine
# pip's keys -> uv's options, as scripts/uv_args.py maps them for set-up
PIP_OPTIONS = {"index-url": "--index-url", "extra-index-url": "--extra-index-url", "find-links": "--find-links",
               "constraint": "--constraint"}  # fmt: skip
FACTS = (
    "import json, site, sys, sysconfig; paths = sysconfig.get_paths(); "
    "print(json.dumps({'version': list(sys.version_info[:3]), 'executable': sys.executable, 'prefix': sys.prefix, "
    "'site': list(dict.fromkeys([paths['purelib'], paths['platlib'], *site.getsitepackages()]))}))"
)


def cache_dir() -> Path:
    """Where environments and resolutions are kept."""
    if os.environ.get(CACHE_VARIABLE):
        return Path(os.environ[CACHE_VARIABLE])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "tensor-runner" / "environments"


def ready(node: Mapping[str, Any] | None, say=print) -> PythonEnvironment | None:
    """The environment environment.* asks for, built where it is not yet (saying how it goes through `say`); None
    for the runner's own. ConfigError (one line) where it cannot be resolved or built."""
    settings = environment_settings(node)
    if is_project_environment(settings):
        return None
    check_environment(settings, "process")
    key = json.dumps(settings, sort_keys=True)
    if key not in _READY:  # once a process: a sweep's jobs and its preflight ask for the same environments
        _READY[key] = _ready(settings, say)
    return _READY[key]


_READY: dict[str, PythonEnvironment] = {}


def _ready(settings: dict[str, Any], say) -> PythonEnvironment:
    label = " ".join(settings["with"]) or str(settings["python"])
    base = _interpreter(_base_python(settings["python"]))
    if settings["with"]:
        resolved = _resolve(settings["with"], settings["find_links"], base, say)
    else:
        resolved = {name: f"{name}=={version}" for name, version in base["installed"].items()}
    changed = {name: line for name, line in resolved.items() if _version(line) != base["installed"].get(name)}
    # the find-links folders' wheels too: a wheel built again at the same version (a user's package) is another set
    wheels = _listing(
        [*uv_index_options(), *(["--find-links", settings["find_links"]] if settings["find_links"] else [])]
    )
    key = _hash(json.dumps([LAYOUT, base["executable"], base["version"], sorted(resolved.values()), wheels]))
    folder = cache_dir() / key
    if not (folder / RECORD).is_file():
        _build(folder, base, changed, settings["find_links"], label, say)
    record = json.loads((folder / RECORD).read_text())
    versions = {name: _version(line) for name, line in resolved.items()}
    changes = {name: f"{base['installed'].get(name, '—')} → {versions[name]}" for name in sorted(changed)}
    return PythonEnvironment(label, str(folder / "bin" / "python"), tuple(record["sys_path"]), versions, changes)


def check_environment(node: Mapping[str, Any] | None, isolation: str) -> None:
    """environment.* as typed, before anything is resolved or built: each requirement parses, the interpreter and
    the find-links folder exist, and a job in another environment runs in a worker process."""
    from packaging.requirements import InvalidRequirement, Requirement

    settings = environment_settings(node)
    for line in settings["with"]:
        try:
            Requirement(line)
        except InvalidRequirement as error:
            raise ConfigError(f"environment.with={line!r} is not a requirement ({first_line(error)})") from None
    python, links = settings["python"], settings["find_links"]
    if python and not shutil.which(python):  # a path, or a program on PATH (python3.12)
        raise ConfigError(f"environment.python={python}: no such program (give an interpreter's path)")
    if links and not Path(links).is_dir():
        raise ConfigError(f"environment.find_links={links}: no such folder")
    if not is_project_environment(settings) and isolation != "process":
        raise ConfigError("environment.with and environment.python run the job in a worker process: isolation=process")


def check_runs(environment: PythonEnvironment, backend_module: str) -> None:
    """ConfigError unless the environment's interpreter imports what a job's worker runs and the backend module (an
    interpreter of the user's own may lack either)."""
    from runner.launch.interpreter import module_path

    code = (f"import importlib, sys; sys.path[:0] = {module_path(environment)!r}; import runner.measure.job; "
            f"importlib.import_module({backend_module!r})")  # fmt: skip
    try:
        probe = _run([environment.python, "-c", code], timeout=PROBE_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise ConfigError(f"environment.python={environment.label}: importing the job took over "
                          f"{PROBE_TIMEOUT_S:.0f} s") from None  # fmt: skip
    if probe.returncode != 0:
        lines = [line for line in probe.stderr.strip().splitlines() if line.strip()]
        reason = lines[-1] if lines else f"exit status {probe.returncode}"
        raise ConfigError(f"environment.python={environment.label} lacks what the job needs: {reason}")


# -- the base interpreter -----------------------------------------------------------------------------------------


def _base_python(asked: str | None) -> str:
    """environment.python as a path (a program on PATH found there), else the runner's own interpreter (its virtual
    environment's, not the one it was made from)."""
    if not asked:
        return sys.executable
    return shutil.which(asked) or asked


@cache
def _interpreter(python: str) -> dict[str, Any]:
    """Facts of an interpreter: its version, executable, site folders and installed packages; ConfigError where it
    is no Python the runner can run in (3.11 or later)."""
    try:
        probe = _run([python, "-c", FACTS], timeout=60)
        facts = json.loads(probe.stdout) if probe.returncode == 0 else None
    except (OSError, subprocess.TimeoutExpired, json.JSONDecodeError):
        facts = None
    if not isinstance(facts, dict):
        raise ConfigError(f"environment.python={python} is not a Python interpreter")
    if tuple(facts["version"]) < (3, 11):
        said = ".".join(map(str, facts["version"]))
        raise ConfigError(f"environment.python={python} is Python {said}: the runner needs Python 3.11 or later")
    listed = _run([_uv(), "pip", "list", "--format", "json", "--python", python], timeout=120)
    if listed.returncode != 0:
        raise ConfigError(f"environment.python={python}: uv cannot list its packages ({_reason(listed.stderr)})")
    facts["installed"] = {_canonical(p["name"]): p["version"] for p in json.loads(listed.stdout or "[]")}
    facts["python"] = python
    return facts


# -- resolving ------------------------------------------------------------------------------------------------------


def _resolve(requirements: list[str], find_links: str | None, base: dict, say) -> dict[str, str]:
    """{package: its pinned line} of the project's requirements with `requirements` over them, the lock's versions
    preferred; cached by everything that decides it."""
    project = _project_requirements(requirements)
    options = [*uv_index_options(), *(["--find-links", find_links] if find_links else [])]
    lock = LOCK.read_text() if LOCK.is_file() else ""
    inputs = [*project, *requirements]
    key = _hash(json.dumps([inputs, options, lock, base["executable"], _listing(options)]))
    cached = cache_dir() / "resolutions" / f"{key}.txt"
    if not cached.is_file():
        with tempfile.TemporaryDirectory(prefix="runner-resolve-") as work:
            wanted, output = Path(work) / "requirements.in", Path(work) / "resolved.txt"
            wanted.write_text("\n".join(inputs) + "\n")
            output.write_text(lock)  # uv keeps the versions an existing output file pins, where it can
            command = [_uv(), "pip", "compile", "-q", "--no-header", "--no-annotate", str(wanted), "-o", str(output)]
            done = _run([*command, "--python", base["python"], *options], timeout=600)
            if done.returncode != 0:
                raise ConfigError(f"environment.with={','.join(requirements)}: {_reason(done.stderr)}")
            cached.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(output, cached)
    return _pins(cached.read_text())


def _project_requirements(overridden: list[str]) -> list[str]:
    """The project's own requirements, less those on a package the override names and exact pins (the lock's
    preferences keep those versions where the override allows: torch==2.13.0 moves torchvision's pin too)."""
    from packaging.requirements import Requirement

    names = {_canonical(Requirement(line).name) for line in overridden}
    kept = []
    for line in _declared_requirements():
        requirement = Requirement(line)
        if _canonical(requirement.name) in names or requirement.marker is not None:
            continue
        exact = any(spec.operator in ("==", "===") for spec in requirement.specifier)
        extras = f"[{','.join(sorted(requirement.extras))}]" if requirement.extras else ""
        kept.append(f"{requirement.name}{extras}" if exact else str(requirement))
    return kept


def _declared_requirements() -> list[str]:
    """pyproject.toml's dependencies from a checkout, the installed package's otherwise."""
    if FROM_CHECKOUT:
        import tomllib

        return list(tomllib.loads((PROJECT_ROOT / "pyproject.toml").read_text())["project"]["dependencies"])
    from importlib import metadata

    return [line for line in metadata.requires("tensor-runner") or [] if "extra ==" not in line]


def _pins(text: str) -> dict[str, str]:
    """{package: line} of uv's output: 'torch==2.13.0+cpu', 'mypkg @ git+file:///repo@SHA'."""
    found = {}
    for raw in text.splitlines():
        line = raw.split(" #", 1)[0].split(";", 1)[0].strip()
        if line and not line.startswith(("#", "-")):
            found[_canonical(re.split(r"[=@ \[]", line, maxsplit=1)[0])] = line
    return found


def _version(line: str) -> str:
    """'2.13.0+cpu' of 'torch==2.13.0+cpu'; a git URL's commit, shortened ('1a2b3c4d5e6f')."""
    if "==" in line:
        return line.split("==", 1)[1].strip()
    commit = re.search(r"@([0-9a-f]{12})[0-9a-f]*$", line.strip())
    return commit.group(1) if commit else line.split("@", 1)[-1].strip().replace(" ", "")


def uv_index_options() -> list[str]:
    """The indexes, find-links and constraints pip is configured with, as uv's options (scripts/uv_args.py's); kept
    in the cache while pip's configuration files and PIP_* variables stay as they were (`pip config list` takes a
    second or two, which a run in a built environment would pay every time)."""
    key = _hash(json.dumps(_pip_configuration()))
    kept = cache_dir() / "pip-options" / f"{key}.json"
    if kept.is_file():
        return list(json.loads(kept.read_text()))
    options = _pip_options()
    kept.parent.mkdir(parents=True, exist_ok=True)
    kept.write_text(json.dumps(options))
    return options


def _pip_configuration() -> list:
    """What pip's configuration is read from: its files (each one's size and time) and the PIP_* variables."""
    xdg = os.environ.get("XDG_CONFIG_DIRS", "/etc/xdg").split(os.pathsep)
    home = Path.home()
    user = [str(home / ".config" / "pip" / "pip.conf"), str(home / ".pip" / "pip.conf")]
    files = [os.environ.get("PIP_CONFIG_FILE", ""), "/etc/pip.conf", *(f"{d}/pip/pip.conf" for d in xdg), *user]
    files.append(f"{sys.prefix}/pip.conf")
    stats = [(f, os.stat(f).st_mtime_ns, os.stat(f).st_size) for f in files if f and os.path.isfile(f)]
    return [stats, sorted((k, v) for k, v in os.environ.items() if k.startswith("PIP_"))]


@cache
def _pip_options() -> list[str]:
    listed = _run([sys.executable, "-m", "pip", "config", "list"], timeout=60).stdout
    config = {}
    for line in listed.splitlines():
        match = re.match(r"^[^=]*?([\w-]+)='(.*)'$", line.strip())
        if match:
            config[match.group(1)] = match.group(2)
    options = [item for key, option in PIP_OPTIONS.items() for value in config.get(key, "").split()
               for item in (option, value)]  # fmt: skip
    if config.get("extra-index-url") or config.get("index-url"):
        options += ["--index-strategy", "unsafe-best-match"]  # pip takes the best version across its indexes
    return options


def _listing(options: list[str]) -> list[str]:
    """The wheels of the find-links folders: a wheel added there is a new resolution."""
    folders = [Path(options[i + 1]) for i, o in enumerate(options[:-1]) if o == "--find-links"]
    return sorted(f"{p}:{p.stat().st_mtime_ns}" for folder in folders if folder.is_dir() for p in folder.iterdir())


def _reason(stderr: str) -> str:
    """uv's reason in one line: its cause (its lines from 'cause:', or from '╰─▶' on a terminal), else its last line;
    whitespace collapsed."""
    lines = [
        line.strip() for line in stderr.strip().splitlines() if line.strip() and not line.strip().startswith("hint:")
    ]
    start = next((i for i, line in enumerate(lines) if line.startswith("cause:") or "╰─▶" in line), None)
    picked = lines[start:] if start is not None else lines[-1:]
    text = " ".join(re.sub(r"^(cause:|╰─▶)", "", line).strip() for line in picked)
    return re.sub(r"\s+", " ", text).strip() or "uv failed"


# -- building -------------------------------------------------------------------------------------------------------


def _build(folder: Path, base: dict, changed: dict[str, str], find_links: str | None, label: str, say) -> None:
    """A venv of `base`'s Python holding `changed`, reading the rest from `base` and the runner's source; made beside
    `folder` and then moved there, so that a build cut short leaves nothing a later run would take; complete once its
    record (its module path where it lies) is written."""
    started = time.monotonic()
    if not folder.is_dir():
        say(f"environment {label}: building in {folder} ({len(changed)} package{'s' * (len(changed) != 1)} over "
            f"{base['executable']})")  # fmt: skip
        folder.parent.mkdir(parents=True, exist_ok=True)
        work = Path(tempfile.mkdtemp(prefix=f".{folder.name}-", dir=folder.parent))
        try:
            _make(work, base, changed, find_links)
            work.rename(folder)
        except OSError:  # another process built it meanwhile
            shutil.rmtree(work, ignore_errors=True)
        except BaseException:
            shutil.rmtree(work, ignore_errors=True)
            raise
    record = json.dumps({"label": label, "sys_path": _interpreter_path(folder), "changed": changed}, indent=1)
    written = folder / f".{RECORD}.{os.getpid()}"
    written.write_text(record)
    written.replace(folder / RECORD)
    say(f"environment {label}: built in {time.monotonic() - started:.1f} s")


def _make(work: Path, base: dict, changed: dict[str, str], find_links: str | None) -> None:
    made = _run([_uv(), "venv", "-q", "--python", base["python"], str(work)], timeout=120)
    if made.returncode != 0:
        raise ConfigError(f"environment: uv cannot make a venv of {base['python']} ({_reason(made.stderr)})")
    python = work / "bin" / "python"
    if changed:
        options = [*uv_index_options(), *(["--find-links", find_links] if find_links else [])]
        options += [item for name in _rebuildable(changed, find_links) for item in ("--refresh-package", name)]
        command = [_uv(), "pip", "install", "--no-deps", "--compile-bytecode", "--python", str(python), *options]
        shown = sys.stderr.isatty()  # uv's own progress bars on a terminal; its reason kept for one line elsewhere
        errors = None if shown else subprocess.PIPE
        done = subprocess.run([*command, *changed.values()], stdout=subprocess.DEVNULL, stderr=errors, text=True,
                              timeout=1800, check=False)  # fmt: skip
        if done.returncode != 0:
            reason = "its output above" if shown else _reason(done.stderr)
            raise ConfigError(f"environment: uv cannot install {' '.join(changed.values())} ({reason})")
    site = _run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], timeout=60)
    # packages only: the runner's own source is the calling checkout's, put first on a worker's path when it starts
    # (runner.launch.interpreter), so that one cached environment serves every checkout of the runner
    lines = [f"import site; site.addsitedir({folder!r})" for folder in base["site"]]
    (Path(site.stdout.strip()) / PTH).write_text("\n".join(lines) + "\n")


def _rebuildable(changed: dict[str, str], find_links: str | None) -> list[str]:
    """The packages to install that environment.find_links holds a wheel of: read from there, not from uv's cache,
    which keeps the first wheel it saw of a version (a user's package built again at the same version)."""
    if not find_links:
        return []
    held = {_canonical(wheel.name.split("-", 1)[0]) for wheel in Path(find_links).glob("*.whl")}
    return sorted(held & changed.keys())


def _interpreter_path(work: Path) -> list[str]:
    """The module path the environment's interpreter starts with (its first entry, the script's folder, aside)."""
    probe = _run([str(work / "bin" / "python"), "-c", "import json, sys; print(json.dumps(sys.path[1:]))"], timeout=60)
    if probe.returncode != 0:
        raise ConfigError(f"environment: its interpreter does not start ({_reason(probe.stderr)})")
    return json.loads(probe.stdout)


# -- helpers --------------------------------------------------------------------------------------------------------


@cache
def _uv() -> str:
    """uv's program: the one installed beside this interpreter (set-up installs it), else on PATH."""
    try:
        from uv import find_uv_bin

        return find_uv_bin()
    except (ImportError, FileNotFoundError):
        found = shutil.which("uv")
    if found is None:
        raise ConfigError("environment.with and environment.python need uv: pip install uv")
    return found


def _run(command: list[str], timeout: float) -> subprocess.CompletedProcess:
    environ = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=False, env=environ)


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _hash(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]

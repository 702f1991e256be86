"""The shape of src/runner: no import cycles, layers in order, heavy frameworks imported only where chosen, modules
and functions short enough to read."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

from runner.config import PROJECT_ROOT

SOURCE = PROJECT_ROOT / "src" / "runner"
PLUGINS = PROJECT_ROOT / "src" / "hydra_plugins"
ARCHITECTURE_PAGE = PROJECT_ROOT / "docs" / "architecture.md"
HEAVY = ("torch", "tensorflow", "keras", "mlflow", "jax")


def _module_name(path: Path) -> str:
    return ".".join(("runner", *path.relative_to(SOURCE).with_suffix("").parts)).removesuffix(".__init__")


def _imports(path: Path, top_level_only: bool) -> set[str]:
    tree = ast.parse(path.read_text())
    nodes = tree.body if top_level_only else ast.walk(tree)
    found: set[str] = set()
    for node in nodes:
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found |= {node.module, *(f"{node.module}.{alias.name}" for alias in node.names)}
        elif isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
    return found


def _graph() -> dict[str, set[str]]:
    modules = {_module_name(p): p for p in SOURCE.rglob("*.py")}
    return {name: _imports(path, top_level_only=False) & (set(modules) - {name}) for name, path in modules.items()}


def test_runner_modules_import_no_cycle():
    graph = _graph()
    done: set[str] = set()

    def visit(name: str, path: tuple[str, ...]) -> None:
        for target in graph[name]:
            assert target not in path, f"import cycle: {' -> '.join((*path, target))}"
            if target not in done:
                visit(target, (*path, target))
        done.add(name)

    for name in graph:
        visit(name, (name,))


BACKENDS_OWN = ("_backend", "_decoder", "_precision")  # backends/*: a backend module and the modules only it imports


def test_heavy_frameworks_are_imported_only_where_chosen():
    """At module level only a backend module (and its own modules: its `decoder` ops, `*_decoder.py`, its precision,
    `*_precision.py`, which only backend modules import) imports its framework; everything else imports one inside
    the function that needs it, so `python run.py backend=numpy` never pays for torch, TensorFlow or MLflow."""
    for path in SOURCE.rglob("*.py"):
        heavy = {name for name in _imports(path, top_level_only=True) if name.split(".")[0] in HEAVY}
        if path.parent.name == "backends" and path.stem.endswith(BACKENDS_OWN):
            assert path.stem.endswith("_backend") or not _imported_outside_backends(path.stem), path
            continue
        assert not heavy, f"{path.relative_to(PROJECT_ROOT)} imports {sorted(heavy)} at module level"


def _imported_outside_backends(stem: str) -> list[str]:
    module = f"runner.backends.{stem}"
    importers = [p for p in SOURCE.rglob("*.py") if p.parent.name != "backends"]
    return [str(p) for p in importers if any(name.startswith(module) for name in _imports(p, top_level_only=False))]


def test_start_up_imports_only_what_it_needs():
    """`run.py --help` and `runner --version` import neither Hydra nor pandas; a job's worker process (forked from a
    server that imported the app, the worker's modules and the upload of its record) neither: Hydra is imported where
    configs are composed, pandas where frames are built (report/, record/setups.py)."""
    code = (
        "import sys; heavy = lambda: sorted({'hydra', 'pandas'} & set(sys.modules)); import runner.app, runner.cli;"
        "print(heavy()); import runner.launch.isolation, runner.measure.job, runner.tracking; print(heavy())"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.splitlines() == ["[]", "[]"], done.stdout


# Lower layers never import higher ones: where configs and outputs are, a run's config and its typed spec, then
# what runs it (backends, models), what it leaves behind (record), how it is measured (measure), MLflow (tracking),
# comparisons (report), each case's runs over time and the gate on them (history: its confirming re-run starts run.py
# in a process of its own, so it needs no launcher), launching (launch), and on top the Hydra app (run.py,
# tensor-runner) and the `runner` command.
LAYERS = (
    ("errors", "locations", "precision", "config", "stores", "identity", "spec"),
    ("backends", "models"),
    "tasks",
    "record",
    "measure",
    "tracking",
    "report",
    "history",
    "launch",
    ("app", "cli", "__main__"),
)


def _layer(module: str) -> int:
    part = module.split(".")[1] if "." in module else ""
    for index, names in enumerate(LAYERS):
        if part in ((names,) if isinstance(names, str) else names):
            return index
    raise AssertionError(f"{module} is in no layer of test_architecture.LAYERS")


def test_packages_import_only_the_layers_below_them():
    for name, targets in _graph().items():
        if name == "runner":
            continue
        for target in targets:
            if target != "runner":
                assert _layer(target) <= _layer(name), f"{name} imports {target}, a layer above it"


# The modules Hydra hands a composed config to, and the configuration layer that reads it into a JobSpec: only these
# read a DictConfig; every other module reads the job's typed spec (runner.spec).
READS_THE_CONFIG = {
    "runner.config",  # the schemas, composition, the combination rules
    "runner.spec",  # the spec read from the config
    "runner.record.naming",  # job_spec(): the keys that copy another, read before resolving erases them
    "runner.app",  # Hydra's task function
    "runner.launch.preflight",  # the command's config composed before Hydra runs
    "runner.launch.job_checks",  # preflight's: each job's config, a sweep's made from its first job's
    "runner.launch.single_run",  # a single run's composed config handed to Hydra's job runner
    "runner.launch.launchers",  # hydra.launcher's node: which launcher runs the sweep
    "runner.launch.local_launcher",  # Hydra's Launcher: each job's config
    "runner.launch.cluster_jobs",  # a cluster job's config, composed again for the record of its end (SLURM, Ray)
    "runner.launch.control",  # the sweep's config: the control case's overrides
    "runner.launch.ray_launch",  # hydra.launcher.ray: Ray's own options
    "runner.launch.sweep.callback",  # Hydra's Callback: the sweep's config
    "runner.launch.sweep.lifecycle",
}


def test_only_the_modules_hydra_hands_a_config_to_read_a_dictconfig():
    readers = {
        _module_name(path)
        for path in SOURCE.rglob("*.py")
        if "omegaconf.DictConfig" in _imports(path, top_level_only=False)
    }
    assert readers <= READS_THE_CONFIG, f"read a DictConfig, not the job's spec: {sorted(readers - READS_THE_CONFIG)}"
    assert READS_THE_CONFIG <= readers, f"read no DictConfig now: {sorted(READS_THE_CONFIG - readers)}"


def test_every_package_says_what_it_owns():
    for init in SOURCE.glob("*/__init__.py"):
        doc = ast.get_docstring(ast.parse(init.read_text()))
        assert doc and len(doc.splitlines()[0]) > 20, f"{init.relative_to(PROJECT_ROOT)} has no docstring"


def test_modules_and_functions_stay_short_enough_to_read():
    """A newcomer reads a module in one sitting and a function on one screen: at most 400 and 60 lines."""
    too_long = []
    for path in SOURCE.rglob("*.py"):
        text = path.read_text()
        if text.count("\n") > 400:
            too_long.append(f"{path.relative_to(SOURCE)}: {text.count(chr(10))} lines")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.end_lineno - node.lineno >= 60:
                too_long.append(f"{path.relative_to(SOURCE)}:{node.name}: {node.end_lineno - node.lineno + 1} lines")
    assert not too_long, too_long


def _named_file(name: str) -> Path | None:
    """The file a `.py` name on the architecture page means: relative to src/runner (`report/ratio.py`), to src
    (`hydra_plugins/...`) or to the repository (`run.py`, `tests/...`); None where none exists."""
    for base in (SOURCE, SOURCE.parent, PROJECT_ROOT):
        if (base / name).is_file():
            return (base / name).resolve()
    return None


def test_the_architecture_page_names_every_module_and_only_modules_that_exist():
    """docs/architecture.md stays true: every module under src/runner and src/hydra_plugins is named on it by its
    path (relative to src/runner, or to src for src/hydra_plugins, `__init__.py` included), and every `.py` file
    it names exists."""
    names = set(re.findall(r"(?<![\w./-])((?:[\w.-]+/)*\w+\.py)\b", ARCHITECTURE_PAGE.read_text()))
    named = {_named_file(name) for name in names}
    modules = sorted(p.resolve() for root in (SOURCE, PLUGINS) for p in root.rglob("*.py"))
    unnamed = [str(p.relative_to(PROJECT_ROOT)) for p in modules if p not in named]
    assert not unnamed, f"docs/architecture.md does not name {unnamed}"
    missing = sorted(name for name in names if _named_file(name) is None)
    assert not missing, f"docs/architecture.md names files that do not exist: {missing}"


def test_no_module_outside_the_tasks_names_a_task_or_its_metrics():
    """The record, the report, MLflow's pages and the launchers read what a task says of itself (runner.tasks.Task:
    its unit, its parts, its metrics, its page lines): none of their code names a built-in task or a task's own
    metric (docstrings and comments may, as examples), so a new task needs no edit there."""
    from runner.tasks import _builtin_targets, builtin_metrics

    names = set(_builtin_targets()) | {m.key for m in builtin_metrics()}
    parts = ("record", "report", "history", "tracking", "launch")
    readers = [p for part in parts for p in (SOURCE / part).rglob("*.py")]
    for path in [*readers, SOURCE / "identity.py", SOURCE / "config.py"]:
        tree = ast.parse(path.read_text())
        docstrings = {
            id(node.body[0].value)
            for node in ast.walk(tree)
            if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
            and node.body and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)
        }  # fmt: skip
        said = {
            word
            for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings
            and not re.search(r"\s", node.value)  # a name or a key ('train_step', 'metrics.ttft_s'), not prose
            for word in re.split(r"\W+", node.value)
        }  # fmt: skip
        assert not said & names, f"{path.relative_to(PROJECT_ROOT)} names {sorted(said & names)}"


def test_benchmarks_and_scripts_name_only_what_the_package_has():
    """A benchmark runs rarely and no test imports it whole: when a function moved (apart_interval, from the
    comparison to the history), benchmarks/history_real.py kept importing it from where it was and failed at its
    first run. Every `from runner... import name` in benchmarks/ and scripts/ names a module or an attribute that
    exists (the modules import no heavy framework at their top)."""
    import importlib.util

    missing = []
    for path in sorted([*(PROJECT_ROOT / "benchmarks").glob("*.py"), *(PROJECT_ROOT / "scripts").glob("*.py")]):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "runner":
                module = importlib.import_module(node.module)
                names = [f"{node.module}.{alias.name}" for alias in node.names if not hasattr(module, alias.name)]
                missing += [f"{path.name}:{node.lineno} {n}" for n in names if importlib.util.find_spec(n) is None]
    assert not missing, f"benchmarks and scripts import what the package no longer has: {missing}"

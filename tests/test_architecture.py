"""The import graph of src/runner: no cycles, and heavy frameworks imported only by the modules that need them."""

from __future__ import annotations

import ast
from pathlib import Path

from runner.config import PROJECT_ROOT

SOURCE = PROJECT_ROOT / "src" / "runner"
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


def test_heavy_frameworks_are_imported_only_where_chosen():
    """At module level only a backend module imports its framework; everything else imports one inside the
    function that needs it, so `python run.py backend=numpy` never pays for torch, TensorFlow or MLflow."""
    for path in SOURCE.rglob("*.py"):
        heavy = {name for name in _imports(path, top_level_only=True) if name.split(".")[0] in HEAVY}
        if path.parent.name == "backends" and path.stem.endswith("_backend"):
            continue
        assert not heavy, f"{path.relative_to(PROJECT_ROOT)} imports {sorted(heavy)} at module level"


# Lower layers never import higher ones: a run's config, then what runs it (backends, models), what it leaves
# behind (record), how it is measured (measure), MLflow (tracking), comparisons (report), launching (launch),
# and the `runner` command on top.
LAYERS = ("config", ("backends", "models"), "record", "measure", "tracking", "report", "launch", ("cli", "__main__"))


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


def test_every_package_says_what_it_owns():
    for init in SOURCE.glob("*/__init__.py"):
        doc = ast.get_docstring(ast.parse(init.read_text()))
        assert doc and len(doc.splitlines()[0]) > 20, f"{init.relative_to(PROJECT_ROOT)} has no docstring"

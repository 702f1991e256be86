"""Every backend module implements the backend protocol and the op families its yaml declares;
a backend and a model can be added from outside src/ with one module and one yaml each."""

from __future__ import annotations

import inspect
import json
from pathlib import Path

import numpy as np
import pytest
from helpers import FAST_TIMING, compose_config, run_cli
from omegaconf import OmegaConf

from runner.backends import OP_FAMILIES, Backend, load_backend, protocol_functions
from runner.backends.optimizers import CONVENTIONS
from runner.config import CONFIG_DIR, PROJECT_ROOT, ConfigError, check_combination
from runner.measure.job import run_and_record
from runner.record.naming import job_spec

PLUGIN = Path(__file__).parent / "plugin"
SEARCHPATH = f"hydra.searchpath=[file://{PLUGIN / 'conf'}]"
BACKEND_YAMLS = sorted((CONFIG_DIR / "backend").glob("*.yaml")) + [PLUGIN / "conf" / "backend" / "fake.yaml"]
KNOWN = {group: {p.stem for p in (CONFIG_DIR / group).glob("*.yaml")} for group in ("mode", "device")}


def _required(function) -> int:
    parameters = [p for name, p in inspect.signature(function).parameters.items() if name != "self"]
    return sum(p.default is inspect.Parameter.empty for p in parameters)


@pytest.mark.parametrize("yaml_path", BACKEND_YAMLS, ids=lambda p: p.stem)
def test_backend_module_implements_what_its_yaml_declares(yaml_path, monkeypatch):
    monkeypatch.syspath_prepend(str(PLUGIN))
    declared = OmegaConf.load(yaml_path)
    module = load_backend(declared.module)
    protocols = [Backend, *(OP_FAMILIES[family] for family in declared.ops)]
    for protocol in protocols:
        for name in protocol_functions(protocol):
            assert hasattr(module, name), f"{declared.module} lacks {name} ({protocol.__name__})"
            expected = getattr(protocol, name, None)
            if not callable(expected):
                continue
            assert callable(getattr(module, name)), f"{declared.module}.{name} is not callable"
            try:
                signature = inspect.signature(getattr(module, name))
            except ValueError:  # a C function (np.exp, torch.tanh): no signature to compare
                continue
            try:
                signature.bind(*[None] * _required(expected))
            except TypeError as error:
                raise AssertionError(
                    f"{declared.module}.{name} cannot be called as {protocol.__name__}: {error}"
                ) from None
    assert set(declared.dtypes) <= set(module.DTYPES), "the yaml allows a dtype the module cannot make"
    assert module.OPTIMIZER_CONVENTION in CONVENTIONS and set(module.TRAIN_STEP_COMPILED) <= set(declared.modes)
    assert set(declared.modes) <= KNOWN["mode"] and set(declared.devices) <= KNOWN["device"]


@pytest.mark.parametrize("yaml_path", BACKEND_YAMLS, ids=lambda p: p.stem)
def test_backend_module_misspells_no_protocol_function(yaml_path, monkeypatch):
    """A function spelled wrong (`sychronizer`) is never called: where the name is optional (an op family the
    yaml does not declare) nothing else fails. A public function of a backend module close to a protocol
    function the module does not define fails here."""
    import difflib

    monkeypatch.syspath_prepend(str(PLUGIN))
    module = load_backend(OmegaConf.load(yaml_path).module)
    owner = {}  # protocol function name -> the protocol that first names it
    for protocol in (Backend, *OP_FAMILIES.values()):
        for name in protocol_functions(protocol):
            owner.setdefault(name, protocol.__name__)
    undefined = [name for name in owner if not hasattr(module, name)]
    own = [
        name
        for name, value in vars(module).items()
        if inspect.isfunction(value) and not name.startswith("_") and value.__module__ == module.__name__
    ]
    short = module.__name__.rsplit(".", 1)[-1]
    for name in (n for n in own if n not in owner):
        close = difflib.get_close_matches(name, undefined, n=1, cutoff=0.8)
        assert not close, f"{short}.{name}: did you mean {owner[close[0]]}.{close[0]}?"


def test_protocols_list_the_functions_the_workloads_use():
    assert {"prepare", "asarray", "to_native_layout", "from_native_layout", "compile_step", "grad"} <= set(
        protocol_functions(Backend)
    )
    assert {"conv2d", "batch_norm", "reflection_pad2d"} <= set(protocol_functions(OP_FAMILIES["conv"]))


def test_backend_and_model_from_outside_src_run_and_match_their_reference(tmp_path, monkeypatch):
    """One module + one yaml each: fake_backend.py + backend/fake.yaml, square_model.py + model/square.yaml."""
    monkeypatch.syspath_prepend(str(PLUGIN))
    cfg = compose_config(SEARCHPATH, "backend=fake", "model=square", "tracking=none", "isolation=inline")
    result = run_and_record(job_spec(cfg), tmp_path)
    assert result.status == "FINISHED", result.error
    assert result.metrics["max_rel_err_vs_reference"] < 1e-12  # float64 autodiff-free gradients, exact
    import fake_backend

    assert fake_backend.CALLS["square"] > 0  # the workload really ran on the fake backend's ops


def test_rules_read_the_declared_capabilities(monkeypatch):
    monkeypatch.syspath_prepend(str(PLUGIN))
    with pytest.raises(ConfigError, match="backend=fake cannot run mode=function"):
        check_combination(compose_config(SEARCHPATH, "backend=fake", "model=square", "mode=function"))
    with pytest.raises(ConfigError, match="model=square runs only task=inference or task=gradients, not task=jacobian"):
        check_combination(compose_config(SEARCHPATH, "backend=fake", "model=square", "task=jacobian"))
    with pytest.raises(
        ConfigError,
        match="model=resnet18 needs conv ops: it runs on backend=jax or backend=tensorflow or backend=torch",
    ):
        check_combination(compose_config(SEARCHPATH, "backend=fake", "model=resnet18", "task=inference"))
    with pytest.raises(ConfigError, match="model=gpt2 needs attention, decoder ops: it runs on backend=jax or "):
        check_combination(compose_config(SEARCHPATH, "backend=fake", "model=gpt2", "task=inference"))
    with pytest.raises(ConfigError, match="model.features='eight' is not a valid int"):
        check_combination(compose_config(SEARCHPATH, "backend=fake", "model=square", "model.features=eight"))


def test_plugin_runs_from_the_command_line_in_a_worker(tmp_path):
    """As a user adds their own: PYTHONPATH for the code, hydra.searchpath for the configs."""
    import os

    os.environ["PYTHONPATH"] = f"{PLUGIN}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"
    try:
        out = run_cli(
            SEARCHPATH, "backend=fake", "model=square", "tracking=none", f"hydra.run.dir={tmp_path}", *FAST_TIMING
        )
    finally:
        os.environ["PYTHONPATH"] = os.environ["PYTHONPATH"].split(os.pathsep, 1)[1]
    assert out.returncode == 0, out.stderr[-2000:]
    saved = json.loads((tmp_path / "result.json").read_text())
    assert saved["status"] == "FINISHED" and saved["environment"]["framework"] == "fake"
    assert np.isfinite(saved["metrics"]["time_median_s"])


def _workload_classes(monkeypatch) -> list[type]:
    """Every workload the configs name: conf/model/*.yaml, tests/plugin's and examples/own_model's."""
    from hydra.utils import get_class

    monkeypatch.syspath_prepend(str(PROJECT_ROOT / "tests" / "plugin"))
    monkeypatch.syspath_prepend(str(PROJECT_ROOT / "examples" / "own_model"))
    folders = [
        PROJECT_ROOT / "conf",
        PROJECT_ROOT / "tests" / "plugin" / "conf",
        PROJECT_ROOT / "examples" / "own_model" / "conf",
    ]
    files = [p for folder in folders for p in (folder / "model").glob("*.yaml")]
    files += list((PROJECT_ROOT / "conf" / "implementation").glob("*.yaml"))  # a model's other implementation
    # a model file made of others by its defaults list (model=gpt2_keras_hub) names no class of its own
    targets = {str(c._target_) for c in map(OmegaConf.load, files) if "_target_" in c}
    return [get_class(t) for t in sorted(targets) if not t.startswith("crash_model")]


def test_every_workload_subclasses_workload_and_misspells_no_default(monkeypatch):
    """An optional method spelled wrong (`trainabel`) would silently never be called: a public name of a
    workload close to one of Workload's but not it fails here."""
    import difflib

    from runner.models import Workload

    known = {n for n in dir(Workload) if not n.startswith("_")} | set(Workload.__annotations__)
    for cls in _workload_classes(monkeypatch):
        assert issubclass(cls, Workload), cls
        for name in (n for n in vars(cls) if not n.startswith("_") and n not in known):
            close = difflib.get_close_matches(name, known, n=1, cutoff=0.85)
            assert not close, f"{cls.__name__}.{name}: did you mean Workload.{close[0]}?"


def test_a_target_that_is_not_a_workload_is_one_line():
    from runner.config import ConfigError, compose
    from runner.models import build_workload

    with pytest.raises(ConfigError, match=r"model._target_=collections.OrderedDict must be a subclass of runner"):
        build_workload(compose(["model=mlp", "model._target_=collections.OrderedDict"]).model)

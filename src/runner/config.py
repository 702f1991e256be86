"""Structured-config schemas and the rules that refuse impossible combinations.

Composition (Hydra + these dataclasses) rejects wrong types and unknown values; `check_combination`
rejects choices that are individually valid but cannot run together. Neither imports a framework.
"""

from __future__ import annotations

import importlib
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from enum import Enum, StrEnum
from pathlib import Path
from typing import Any, cast

from omegaconf import MISSING, DictConfig, OmegaConf

from runner.errors import ConfigError
from runner.locations import CONFIG_DIR, PROJECT_ROOT, output_root  # noqa: F401  (PROJECT_ROOT: for tests, tools)
from runner.precision import check_precision


class DType(StrEnum):
    float32 = "float32"
    float64 = "float64"
    float16 = "float16"
    bfloat16 = "bfloat16"


class DataSource(StrEnum):
    random = "random"
    image = "image"
    tfrecord = "tfrecord"
    hdf5 = "hdf5"


class Isolation(StrEnum):
    process = "process"  # each job's measurement in a fresh spawned worker process (the default)
    inline = "inline"  # in the Hydra job's own process: for tests and debugging


@dataclass
class BackendConfig:
    """What a backend is and can do (conf/backend/NAME.yaml): the combination rules read this."""

    name: str = MISSING
    module: str = MISSING  # the module implementing the backend function set (runner.backends.Backend)
    dtypes: list[str] = MISSING
    devices: list[str] = MISSING  # besides "auto", which every backend resolves
    modes: list[str] = MISSING
    ops: list[str] = MISSING  # op families: dense, conv, layout
    # every call records the caller's Python stack (jaxlib's tracebacks), at a cost that grows with its depth: the
    # runner times such calls from a thread of their own, as shallow as a script's (runner.measure.timing.measure)
    records_caller_stack: bool = False


@dataclass
class DeviceConfig:
    name: str = MISSING  # cpu, cuda or auto


@dataclass
class ModeConfig:
    name: str = MISSING
    per_example: bool = False  # computes per-example gradients: needs task=gradients


@dataclass
class DataConfig:
    name: DataSource = MISSING
    path: str | None = None  # image file or folder, TFRecord file, HDF5 file
    dataset: str = "images"  # hdf5: the dataset holding the images
    image_size: int = 224  # random: side of the synthetic images for vision models


@dataclass
class TrackingConfig:
    name: str = MISSING  # "mlflow" or "none"
    uri: str | None = None
    experiment: str = "tensor-runner"


@dataclass
class TimingConfig:
    warmup_s: float = 0.2  # warm up at least this long ...
    min_warmup_calls: int = 3  # ... and at least this many calls
    min_repeats: int = 10  # samples before the spread may stop the measurement
    max_time_s: float = 5.0  # hard cap on the measurement phase
    target_rel_iqr: float = 0.03  # stop early once IQR/median is below this
    min_block_s: float = 0.002  # calls are timed in blocks at least this long
    keep_freed_memory: bool = True  # glibc keeps freed memory: no history-dependent page faults per call
    fixed_layout: bool = True  # workers start without address-space randomization: every process the same layout
    rounds: int = 40  # a sweep measures its jobs in up to this many interleaved rounds (1: one after the other)
    processes: int = 3  # ... each job in up to this many worker processes, taking its turns in rotation
    resolve: float = 0.1  # a sweep's rounds stop once every comparison resolves this difference (0: use the budget)
    poll_idle: bool = False  # idle CPUs poll, not halt, while a job is timed (/dev/cpu_dma_latency, root)
    profile: bool = False  # after timing, the call profiled for a moment: profile.pstats (runner.measure.profile)
    series: dict[str, str] = field(default_factory=dict)  # a value beside every sample (conf/config.yaml)

    @classmethod
    def of(cls, node: DictConfig) -> TimingConfig:
        """The composed timing.* as this dataclass, every value resolved (a job's worker gets its config as a
        plain node, without the schema): what runner.spec.JobSpec carries."""
        return cls(**cast(dict, OmegaConf.to_container(node, resolve=True)))  # a DictConfig's container is a dict


@dataclass
class RunConfig:
    backend: BackendConfig = MISSING
    device: DeviceConfig = MISSING
    # A workload: `_target_` (its class), `name`, its constructor's arguments and `supports` (what it can
    # be combined with); untyped here because every workload has its own arguments, checked against the
    # class's signature by check_combination.
    model: Any = MISSING
    mode: ModeConfig = MISSING
    task: Any = MISSING  # a task: `_target_` (its runner.tasks.Task class), `name` and its constructor's arguments
    optimizer: Any = MISSING  # task=train_step's (conf/optimizer/NAME.yaml), read through the task's ${optimizer}
    precision: Any = MISSING  # conf/precision/NAME.yaml: `name` and what it `supports` (runner.precision)
    data: DataConfig = MISSING
    tracking: TrackingConfig = MISSING
    timing: TimingConfig = field(default_factory=TimingConfig)
    dtype: DType = DType.float32
    batch_size: int = 32
    seed: int = 0
    threads: int | None = None  # intra-op threads of the chosen backend; None: the framework's own default
    isolation: Isolation = Isolation.process
    check_reference: bool = True  # compare with a float64 numpy computation (false: skip it, e.g. huge matmuls)
    control: Any = None  # conf/control/NAME.yaml: a case a sweep times beside its jobs (`name`, `overrides`)
    environment: Any = None  # conf/environment/: `with` (a keyword, no typed field), `python`, `find_links`


def register_configs() -> None:
    """The schema conf/config.yaml names (`base_config`) in Hydra's ConfigStore, and the resolvers. Hydra's scan for
    plugins runs this (hydra_plugins.tensor_runner) before it composes anything; compose() and the app run it too."""
    from hydra.core.config_store import ConfigStore

    ConfigStore.instance().store(name="base_config", node=RunConfig)
    register_resolvers()


def register_resolvers() -> None:
    """What the configs' `${runner.*:}` resolve with: at import, so that a job's worker, which never imports Hydra,
    resolves its config too."""
    if not OmegaConf.has_resolver("runner.root"):
        OmegaConf.register_new_resolver("runner.root", lambda: str(output_root()))
    if not OmegaConf.has_resolver("runner.devices"):  # sweep values: the devices this machine has
        OmegaConf.register_new_resolver("runner.devices", lambda: "cpu,cuda" if nvidia_driver_present() else "cpu")


register_resolvers()


def compose(overrides: list[str], config_dir: Path = CONFIG_DIR, return_hydra_config: bool = False) -> DictConfig:
    """The config `python run.py OVERRIDES` would run, composed in this process (tests, benchmarks, preflight)."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    register_configs()
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(config_dir), version_base="1.3"):
            return hydra_compose(config_name="config", overrides=overrides, return_hydra_config=return_hydra_config)
    finally:
        GlobalHydra.instance().clear()


# -- combination rules: one generic rule over what the backend, mode and model declare -----------

MODEL_META_KEYS = ("_target_", "name", "supports", "pretrained", "weights")  # not constructor arguments
# What a backend, mode or model can do: data for the rules, not a parameter of the run.
# A backend's node is all such data but its name (module, dtypes, ..., records_caller_stack): no param, no case key.
CAPABILITY_KEYS = tuple(f"backend.{f.name}" for f in fields(BackendConfig) if f.name != "name")
CAPABILITY_PREFIXES = ("mode.per_example", "model.supports", "model._target_", "precision.supports")


def is_capability(flat_key: str) -> bool:
    """True for a flattened config key ("backend.dtypes", "model.supports.tasks") that describes a capability."""
    return flat_key in CAPABILITY_KEYS or flat_key.startswith(CAPABILITY_PREFIXES)


def choices(cfg: Mapping[str, Any]) -> dict[str, str]:
    """The choice of each axis as plain strings: backend, device, model, mode, task, dtype. `cfg` is the composed
    config or its resolved values (JobSpec.config)."""
    return {
        "backend": str(cfg["backend"]["name"]),
        "device": _name(cfg["device"]["name"]),
        "model": str(cfg["model"]["name"]),
        "mode": str(cfg["mode"]["name"]),
        "task": _name(cfg["task"]["name"]),
        "dtype": _name(cfg["dtype"]),
    }


def _name(value: object) -> str:
    return value.value if isinstance(value, Enum) else str(value)


GROUPS = ("backend", "device", "model", "mode", "task", "data", "tracking", "precision")
MAX_SECONDS = 86_400.0  # timing values above a day are typing mistakes, not budgets
# name: (smallest allowed, largest allowed, whether the smallest itself is allowed)
TIMING_LIMITS = {
    "warmup_s": (0.0, MAX_SECONDS, True),
    "max_time_s": (0.0, MAX_SECONDS, False),
    "min_block_s": (0.0, 60.0, True),
    "target_rel_iqr": (0.0, 1e3, True),
    "min_warmup_calls": (0, 10**12, True),
    "min_repeats": (1, 10**12, True),
    "rounds": (1, 1000, True),
    "processes": (1, 64, True),
    "resolve": (0.0, 10.0, True),
}


def check_values(cfg: Mapping[str, Any]) -> None:
    """Raise ConfigError (one line) for a config group removed (`~model`), a timing value no measurement
    can honour, or tracking settings that would log somewhere else than the user meant. `cfg` is the composed
    config or its resolved values (JobSpec.config)."""
    for group in GROUPS:
        if (isinstance(cfg, DictConfig) and OmegaConf.is_missing(cfg, group)) or cfg.get(group) is None:
            options = ", ".join(sorted(p.stem for p in (CONFIG_DIR / group).glob("*.yaml")))
            raise ConfigError(f"no {group} is chosen (~{group} removed it): choose one of {options}")
    for name, (low, high, low_ok) in TIMING_LIMITS.items():
        value = cfg["timing"][name]
        if not (math.isfinite(value) and (low <= value if low_ok else low < value) and value <= high):
            bound = ">=" if low_ok else ">"
            raise ConfigError(f"timing.{name}={value}: must be a finite number {bound} {low} and <= {high:g}")
    tracking = cfg["tracking"]
    if tracking["name"] != "none":
        from runner.stores import check_tracking

        check_tracking(tracking["uri"], tracking["experiment"])


def check_combination(cfg: Mapping[str, Any]) -> None:
    """Raise ConfigError (one line) for choices that cannot run together. Imports no framework. `cfg` is the
    composed config or its resolved values (JobSpec.config, which is what a job checks)."""
    check_values(cfg)
    c = choices(cfg)
    batch_size, seed, threads = cfg["batch_size"], cfg["seed"], cfg["threads"]
    if batch_size < 1:
        raise ConfigError(f"batch_size={batch_size}: must be a positive integer")
    if not 0 <= seed < 2**63:  # numpy takes no negative seed, HDF5 no integer beyond 64 bits
        raise ConfigError(f"seed={seed}: must be an integer from 0 to 2**63 - 1")
    if threads is not None and threads < 1:
        raise ConfigError(f"threads={threads}: must be a positive integer, or null for the framework's default")
    _check_backend(cfg["backend"], c)
    check_precision(cfg["precision"], cfg["model"], c)
    target = cfg["task"].get("_target_")
    task: Any = class_named("task._target_", target)  # a runner.tasks.Task, by its attributes
    if not hasattr(task, "like"):  # what runner.tasks.Task has, read without importing a layer above this one
        raise ConfigError(f"task._target_={target} must be a subclass of runner.tasks.Task")
    if cfg["mode"]["per_example"] and not task.per_example_modes:
        raise ConfigError(f"mode={c['mode']} computes per-example gradients: task={c['task']} has none")
    _check_model(cfg["model"], cfg["backend"], c, task.like)
    check_task_arguments(cfg["task"])
    if c["device"] == "cuda" and not nvidia_driver_present():
        raise ConfigError("device=cuda but this machine has no NVIDIA GPU driver (use device=cpu or auto)")


def _check_backend(backend: Mapping[str, Any], c: dict[str, str]) -> None:
    b, modes, devices, dtypes = c["backend"], backend["modes"], backend["devices"], backend["dtypes"]
    if c["mode"] not in modes:
        raise ConfigError(f"backend={b} cannot run mode={c['mode']} (allowed: {', '.join(modes)})")
    if c["device"] not in (*devices, "auto"):
        raise ConfigError(f"backend={b} cannot run on device={c['device']} (allowed: {', '.join(devices)}, auto)")
    if c["dtype"] not in dtypes:
        raise ConfigError(f"backend={b} cannot compute in dtype={c['dtype']} (allowed: {', '.join(dtypes)})")


def _check_model(model: Mapping[str, Any], backend: Mapping[str, Any], c: dict[str, str], task_like: str) -> None:
    """The model's `supports` lists; a task it does not list passes where the built-in task it runs like does."""
    supports = model.get("supports") or {}
    narrower = (supports.get("on_backend") or {}).get(c["backend"]) or {}  # limits on one backend only
    for axis in ("task", "mode", "device", "dtype"):
        allowed = narrower.get(f"{axis}s", supports.get(f"{axis}s"))
        passes = c[axis] == "auto" if axis == "device" else axis == "task" and task_like in (allowed or ())
        if allowed is not None and c[axis] not in allowed and not passes:
            only = " or ".join(f"{axis}={value}" for value in allowed)
            on = f" on backend={c['backend']}" if f"{axis}s" in narrower else ""
            raise ConfigError(f"model={c['model']} runs only {only}{on}, not {axis}={c[axis]}")
    missing = [family for family in supports.get("ops", []) if family not in backend["ops"]]
    if missing:
        able = [name for name, ops in backend_capabilities().items() if set(missing) <= set(ops)]
        where = " or ".join(f"backend={name}" for name in able) or "no installed backend"
        elsewhere = f"; {supports['elsewhere']}" if supports.get("elsewhere") else ""  # the model's other routes
        raise ConfigError(
            f"model={c['model']} needs {', '.join(missing)} ops: it runs on {where}, not backend={c['backend']}"
            f"{elsewhere}"
        )
    check_model_arguments(model)


def backend_capabilities() -> dict[str, list[str]]:
    """{backend name: its op families}, from conf/backend/*.yaml."""
    found = {}
    for path in sorted((CONFIG_DIR / "backend").glob("*.yaml")):
        declared = cast(DictConfig, OmegaConf.load(path))  # a backend file is a mapping
        found[str(declared.name)] = list(declared.get("ops", []))
    return found


def check_model_arguments(model: Mapping[str, Any]) -> None:
    """The model's settings against its class's constructor: unknown class, missing or mistyped arguments."""
    check_arguments("model", model, workload_arguments(model))


TASK_META_KEYS = ("_target_", "name")  # a task's settings that are not its constructor's arguments (name is passed)


def check_task_arguments(task: Mapping[str, Any]) -> None:
    """The task's settings against its class's constructor, as a model's are (task.new_tokens=abc, =true, =1e1)."""
    check_arguments("task", task, {k: v for k, v in plain(task).items() if k not in TASK_META_KEYS})


def check_arguments(group: str, node: Mapping[str, Any], arguments: Mapping[str, Any]) -> None:
    """A model's or task's settings against the constructor of the class its `_target_` names: the class exists, it
    takes every setting (or **kwargs), no argument without a default is missing, and each typed one is of its type (an
    integer is no float and no bool)."""
    import inspect
    import typing

    target = node.get("_target_")
    if not target:
        raise ConfigError(f"{group}={node.get('name')} names no class: set {group}._target_ to its class")
    cls: type[Any] = class_named(f"{group}._target_", target)
    hints = typing.get_type_hints(cls.__init__)
    parameters = inspect.signature(cls).parameters
    if not any(p.kind == p.VAR_KEYWORD for p in parameters.values()):
        unknown = [key for key in arguments if key not in parameters]
        if unknown:
            takes = ", ".join(k for k in parameters if k not in TASK_META_KEYS)
            raise ConfigError(f"{group}={node.get('name')} has no setting {unknown[0]} (its settings: {takes})")
    for name, parameter in parameters.items():
        if name in TASK_META_KEYS or parameter.kind in (parameter.VAR_KEYWORD, parameter.VAR_POSITIONAL):
            continue
        if name not in arguments and parameter.default is inspect.Parameter.empty:
            raise ConfigError(f"{group}={node['name']} needs {group}.{name} ({target})")
        if name in arguments and not _fits(arguments[name], hints.get(name)):
            expected = getattr(hints[name], "__name__", str(hints[name]))
            raise ConfigError(f"{group}.{name}={arguments[name]!r} is not a valid {expected}")


def class_named(key: str, path: str) -> type:
    """The class a config value names (`package.module.Class`), or ConfigError in one line."""
    module, _, name = str(path).rpartition(".")
    try:
        found = getattr(importlib.import_module(module), name) if module and name else None
    except Exception as error:  # not found, or the module itself fails to import
        raise ConfigError(f"{key}={path} cannot be imported ({type(error).__name__}: {first_line(error)})") from None
    if not isinstance(found, type):
        raise ConfigError(f"{key}={path} names no class (write it as package.module.Class)")
    return found


def workload_arguments(model: Mapping[str, Any]) -> dict:
    """The model's settings that are its class's constructor arguments."""
    return {k: v for k, v in plain(model).items() if k not in MODEL_META_KEYS}


def plain(node: Mapping[str, Any]) -> dict[str, Any]:
    """A config node's values as plain Python (a DictConfig resolved, enums as their names; a dict as it is): what
    everything below this layer reads (runner.spec.JobSpec's settings)."""
    if isinstance(node, DictConfig):
        return cast(dict, OmegaConf.to_container(node, resolve=True, enum_to_str=True))  # a DictConfig's: a dict
    return dict(node)


def _fits(value: object, hint: object) -> bool:
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint is float:
        return isinstance(value, int | float) and not isinstance(value, bool)
    if hint is str:
        return isinstance(value, str)
    return True  # anything richer is the workload's own business


def require_positive(group: str = "model", **sizes: int) -> None:
    """For a workload's or task's constructor: sizes (model.n=0, model.hidden=-1, task.new_tokens=0) are refused with
    one line naming the key."""
    for name, value in sizes.items():
        if value < 1:
            raise ConfigError(f"{group}.{name}={value}: must be a positive integer")


def first_line(error: BaseException) -> str:
    """The first line of an error's message (its class name when it has none): what a user reads."""
    text = str(error).strip()
    return text.splitlines()[0].strip() if text else type(error).__name__


def nvidia_driver_present() -> bool:
    """True when the kernel has an NVIDIA driver loaded: checked without importing any framework."""
    gpus = Path("/proc/driver/nvidia/gpus")
    return gpus.is_dir() and any(gpus.iterdir()) or os.path.exists("/dev/nvidia0")

"""Structured-config schemas and the rules that refuse impossible combinations.

Composition (Hydra + these dataclasses) rejects wrong types and unknown values; `check_combination`
rejects choices that are individually valid but cannot run together. Neither imports a framework.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from enum import Enum, StrEnum
from pathlib import Path

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig, OmegaConf

PROJECT_ROOT = Path(__file__).resolve().parents[2]


class ConfigError(ValueError):
    """A configuration that cannot run; its message is one line meant for the user."""


class Backend(StrEnum):
    numpy = "numpy"
    torch = "torch"
    tensorflow = "tensorflow"
    tnp = "tnp"


class Device(StrEnum):
    cpu = "cpu"
    cuda = "cuda"
    auto = "auto"


class ModelName(StrEnum):
    mlp = "mlp"
    matmul = "matmul"
    sigmoid = "sigmoid"
    alexnet = "alexnet"
    resnet18 = "resnet18"
    resnet50 = "resnet50"
    resnet101 = "resnet101"
    cyclegan = "cyclegan"
    conversion = "conversion"
    reshape = "reshape"


class DType(StrEnum):
    float32 = "float32"
    float64 = "float64"
    float16 = "float16"
    bfloat16 = "bfloat16"


class Mode(StrEnum):
    eager = "eager"
    function = "function"
    xla = "xla"
    vectorized_map = "vectorized_map"
    map_fn = "map_fn"


class Task(StrEnum):
    inference = "inference"
    gradients = "gradients"
    jacobian = "jacobian"


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
    name: Backend = MISSING


@dataclass
class DeviceConfig:
    name: Device = MISSING


@dataclass
class ModeConfig:
    name: Mode = MISSING


@dataclass
class TaskConfig:
    name: Task = MISSING


@dataclass
class ModelConfig:
    name: ModelName = MISSING
    in_features: int = 32  # mlp
    hidden: int = 64  # mlp
    out_features: int = 2  # mlp
    n: int = 1000  # matmul: n x n
    size: int = 1024  # sigmoid: vector length
    method: str = ""  # conversion / reshape: which operation (see conf/model/conversion.yaml, reshape.yaml)
    pretrained: bool = False  # vision: torchvision's weights from the local torch hub cache
    weights: str | None = None  # vision: a local state dict (.pth) or HDF5 file of named arrays


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


@dataclass
class RunConfig:
    backend: BackendConfig = MISSING
    device: DeviceConfig = MISSING
    model: ModelConfig = MISSING
    mode: ModeConfig = MISSING
    task: TaskConfig = MISSING
    data: DataConfig = MISSING
    tracking: TrackingConfig = MISSING
    timing: TimingConfig = field(default_factory=TimingConfig)
    dtype: DType = DType.float32
    batch_size: int = 32
    seed: int = 0
    isolation: Isolation = Isolation.process
    check_reference: bool = True  # compare with a float64 numpy computation (false: skip it, e.g. huge matmuls)


def register_configs() -> None:
    ConfigStore.instance().store(name="base_config", node=RunConfig)
    if not OmegaConf.has_resolver("runner.root"):
        OmegaConf.register_new_resolver("runner.root", lambda: str(PROJECT_ROOT))
    if not OmegaConf.has_resolver("runner.devices"):  # sweep values: the devices this machine has
        OmegaConf.register_new_resolver("runner.devices", lambda: "cpu,cuda" if nvidia_driver_present() else "cpu")


register_configs()


# -- combination rules -------------------------------------------------------------------------

COMPILED_MODES = {"function", "xla"}
PER_EXAMPLE_MODES = {"vectorized_map", "map_fn"}
OP_WORKLOADS = {"matmul", "sigmoid", "conversion", "reshape"}
LAYOUT_WORKLOADS = {"conversion", "reshape"}
VISION_MODELS = {"alexnet", "resnet18", "resnet50", "resnet101", "cyclegan"}
VISION_BACKENDS = {"torch", "tensorflow"}
BACKEND_DTYPES = {
    "numpy": {"float32", "float64", "float16"},
    "torch": {"float32", "float64", "float16", "bfloat16"},
    "tensorflow": {"float32", "float64", "float16", "bfloat16"},
    "tnp": {"float32", "float64", "float16", "bfloat16"},
}


def choices(cfg: DictConfig) -> dict[str, str]:
    """The choice of each axis as plain strings: backend, device, model, mode, task, dtype."""
    return {
        "backend": _name(cfg.backend.name),
        "device": _name(cfg.device.name),
        "model": _name(cfg.model.name),
        "mode": _name(cfg.mode.name),
        "task": _name(cfg.task.name),
        "dtype": _name(cfg.dtype),
    }


def _name(value: object) -> str:
    return value.value if isinstance(value, Enum) else str(value)


def check_combination(cfg: DictConfig) -> None:
    """Raise ConfigError (one line) for choices that cannot run together. Imports no framework."""
    c = choices(cfg)
    backend, mode, task, model = c["backend"], c["mode"], c["task"], c["model"]
    if cfg.batch_size < 1:
        raise ConfigError(f"batch_size={cfg.batch_size}: must be a positive integer")
    if backend == "numpy" and mode != "eager" and mode != "map_fn":
        raise ConfigError(
            f"backend=numpy cannot run mode={mode}: numpy has no compiler or vectorizing map (allowed: eager, map_fn)"
        )
    if backend == "numpy" and c["device"] == "cuda":
        raise ConfigError("backend=numpy runs on the CPU only (allowed: device=cpu or device=auto)")
    if c["dtype"] not in BACKEND_DTYPES[backend]:
        allowed = ", ".join(sorted(BACKEND_DTYPES[backend]))
        raise ConfigError(f"backend={backend} cannot compute in dtype={c['dtype']} (allowed: {allowed})")
    if mode in PER_EXAMPLE_MODES and task != "gradients":
        raise ConfigError(f"mode={mode} computes per-example gradients and needs task=gradients, not task={task}")
    if model in OP_WORKLOADS and task != "inference":
        raise ConfigError(f"model={model} is an op workload: only task=inference is defined for it")
    if model in LAYOUT_WORKLOADS and (mode != "eager" or c["device"] == "cuda" or c["dtype"] == "bfloat16"):
        raise ConfigError(f"model={model} measures host memory layout: eager mode on the cpu, no bfloat16")
    if model in VISION_MODELS and backend not in VISION_BACKENDS:
        raise ConfigError(f"model={model} runs on backend=torch or backend=tensorflow, not backend={backend}")
    if model in VISION_MODELS and task == "jacobian":
        raise ConfigError(f"model={model}: task=jacobian is defined for the mlp only (allowed: inference, gradients)")
    if model not in VISION_MODELS and (cfg.model.pretrained or cfg.model.weights):
        raise ConfigError(
            f"model={model} has seeded weights only: model.pretrained/model.weights are for vision models"
        )
    if c["device"] == "cuda" and not nvidia_driver_present():
        raise ConfigError("device=cuda but this machine has no NVIDIA GPU driver (use device=cpu or auto)")


def nvidia_driver_present() -> bool:
    """True when the kernel has an NVIDIA driver loaded: checked without importing any framework."""
    gpus = Path("/proc/driver/nvidia/gpus")
    return gpus.is_dir() and any(gpus.iterdir()) or os.path.exists("/dev/nvidia0")

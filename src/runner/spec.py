"""One job, typed: its choices and the settings that run and record it, read once from the composed config.

Everything that runs a job and writes its record reads a `JobSpec`, not the config: runner.measure, runner.record,
and in runner.launch the job's execution on this machine (isolation, its worker process, the interleaved rounds)
and what a cluster launcher records of a job that ended there. The spec is made where Hydra hands over a job's
composed config (the app's task function, a launcher's job); a worker process receives it pickled.

The model's, the task's and the data's own settings are their nodes as plain values (resolved dicts), since a
workload or task of the user's own is built from whatever its node holds. Building a spec checks nothing: the
combination rules (runner.config.check_combination, on `config`) run in the job, so that a sweep's refused job is
recorded beside the others (a single run's are refused before: runner.launch.preflight).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, cast

from omegaconf import DictConfig, OmegaConf

from runner.config import TimingConfig, TrackingConfig, choices, plain
from runner.identity import config_params


def environment_settings(node: Mapping[str, Any] | None) -> dict[str, Any]:
    """environment.* as plain values: `with` a list of requirement strings (one string, as a sweep's value is, a list
    of one), `python` and `find_links` a path or None. The project's own environment where all three are unset."""
    settings = plain(node) if node else {}
    requirements = settings.get("with") or []
    if isinstance(requirements, str):
        requirements = [requirements]
    return {
        "with": [str(r).strip() for r in requirements],
        "python": settings.get("python") or None,
        "find_links": settings.get("find_links") or None,
    }


def is_project_environment(settings: Mapping[str, Any]) -> bool:
    """True where a job runs in the runner's own environment: nothing installed over it, no other interpreter."""
    return not settings["with"] and not settings["python"]


@dataclass(frozen=True)
class PythonEnvironment:
    """A Python environment a job's workers run in, built (runner.launch.environments) from environment.*."""

    label: str  # what it was asked as: 'torch==2.13.0', or the interpreter's path
    python: str  # its interpreter, which starts the job's workers
    sys_path: tuple[str, ...]  # that interpreter's own module path: a spawned worker gets it, not the launcher's
    versions: dict[str, str]  # its resolved set: package -> version ('2.13.0+cpu', or the commit of a git URL)
    changes: dict[str, str]  # package -> '2.14.1 → 2.13.0+cpu' where it differs from the runner's own environment

    def changes_said(self) -> str:
        """'torch 2.14.1 → 2.13.0+cpu, torchvision 0.29.1 → 0.28.0', or 'as the runner's own'."""
        return ", ".join(f"{name} {change}" for name, change in self.changes.items()) or "as the runner's own"

    def record(self) -> dict[str, str]:
        """What result.json's `environment` (and MLflow's env.* tags) keep of it (its python: the interpreter the
        worker found itself in, which runner.measure.job writes over this)."""
        return {
            "python_environment": self.label,
            "python_environment_python": self.python,
            "python_environment_changes": self.changes_said(),
            "python_environment_versions": " ".join(f"{name}=={v}" for name, v in sorted(self.versions.items())),
        }


@dataclass(frozen=True)
class JobSpec:
    backend: str
    device: str  # as chosen: "auto" is resolved by the backend (the record says which device ran)
    model: str
    mode: str
    task: str
    dtype: str
    precision: str  # conf/precision/NAME.yaml (runner.precision): float32 matmul precision, mixed-precision policy
    backend_module: str  # the module implementing the backend (conf/backend/NAME.yaml `module:`)
    per_example: bool  # the mode computes one result per example (conf/mode/NAME.yaml)
    records_caller_stack: bool  # the backend's calls record the caller's stack (conf/backend/NAME.yaml)
    batch_size: int
    seed: int
    threads: int | None
    check_reference: bool
    isolation: str  # "process" (a worker process of its own) or "inline" (in the Hydra job's process)
    timing: TimingConfig  # timing.*, resolved
    tracking: TrackingConfig  # where the run is logged (name "none": nowhere)
    model_settings: dict[str, Any] = field(repr=False)  # the model's node: what its workload is built from
    task_settings: dict[str, Any] = field(repr=False)  # the task's node: what its Task is built from (runner.tasks)
    data_settings: dict[str, Any] = field(repr=False)  # the data's node: what the inputs are loaded from
    config: dict = field(repr=False)  # the resolved config, as result.json records it
    copied_keys: dict[str, str] = field(default_factory=dict)  # config key -> the key it copies
    environment_settings: dict[str, Any] = field(default_factory=dict)  # environment.* (runner.config)
    environment: PythonEnvironment | None = None  # built from them where a worker starts (runner.launch.isolation)

    @classmethod
    def of(cls, cfg: DictConfig, copied_keys: dict[str, str] | None = None) -> JobSpec:
        c = choices(cfg)
        config = cast(dict, OmegaConf.to_container(cfg, resolve=True, enum_to_str=True))
        config["environment"] = environment_settings(config.get("environment"))  # one spelling: `with` a list
        return cls(
            **cast(dict[str, Any], c),  # the six choices, by name
            precision=str(cfg.precision.name),
            backend_module=str(cfg.backend.module),
            per_example=bool(cfg.mode.per_example),
            records_caller_stack=bool(cfg.backend.records_caller_stack),
            batch_size=int(cfg.batch_size),
            seed=int(cfg.seed),
            threads=None if cfg.threads is None else int(cfg.threads),
            check_reference=bool(cfg.check_reference),
            isolation=str(cfg.isolation),
            timing=TimingConfig.of(cfg.timing),
            tracking=TrackingConfig(**plain(cfg.tracking)),
            model_settings=plain(cfg.model),
            task_settings=plain(cfg.task),
            data_settings=plain(cfg.data),
            config=config,
            copied_keys=copied_keys or {},
            environment_settings=config["environment"],
        )

    def choices(self) -> dict[str, str]:
        """The choice of each axis as plain strings, as tensors.h5's attributes and the run's name use them."""
        return {
            "backend": self.backend,
            "device": self.device,
            "model": self.model,
            "mode": self.mode,
            "task": self.task,
            "dtype": self.dtype,
        }

    def params(self) -> dict[str, str]:
        """The settings that apply to the job, flattened: what its identity is computed from (runner.identity)."""
        return config_params(self.config, self.copied_keys)

    def mlflow_store(self) -> tuple[str, str] | None:
        """(tracking URI, experiment) where the run is logged to MLflow; None where it is not tracked."""
        where = self.tracking
        return (where.uri, where.experiment) if where.name == "mlflow" and where.uri else None

    def in_processes(self, processes: int) -> JobSpec:
        """The same job, measured in `processes` worker processes (runner.launch.rounds starts the others)."""
        config = {**self.config, "timing": {**self.config["timing"], "processes": processes}}
        return replace(self, timing=replace(self.timing, processes=processes), config=config)

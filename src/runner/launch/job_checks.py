"""Each job checked before anything starts (runner.launch.preflight): a single run's, and every job of a sweep as
Hydra's basic sweeper makes them (BasicSweeper.split_arguments: the product of the sweeper's params and the command
line's overrides, in that order). What needs only the config is checked with no framework imported: the model's
settings, by building its workload where that needs no framework (Workload.builds_without_framework), a built-in
task's settings against that workload (task.prompt_lengths, task.new_tokens), and the data's fit to the model.

A sweep's job whose settings are refused refuses the whole sweep, in one line naming the job, before anything is
written. A job whose choices cannot run together (runner.config.check_combination: numpy with mode=function, in a
sweep of backends and modes) is left to its turn, recorded FAILED beside the others (docs/sweeps.md)."""

from __future__ import annotations

import copy
import sys
from collections.abc import Callable, Mapping
from itertools import product
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hydra.core.override_parser.overrides_parser import OverridesParser

from runner.config import ConfigError

if TYPE_CHECKING:
    from omegaconf import DictConfig

BASIC_SWEEPER = "hydra._internal.core_plugins.basic_sweeper.BasicSweeper"


def check_single(cfg: DictConfig) -> None:
    """A single run's choices and settings (ConfigError, one line): the combination rules, then its settings."""
    from runner.config import check_combination
    from runner.models import check_known_wrong
    from runner.record.naming import described

    resolved = described(cfg, strict=True)  # model.weights=FOLDER: its config.json's settings
    check_combination(resolved)
    check_known_wrong(resolved["model"], _choices(resolved))
    if resolved.get("control"):  # one more job of a sweep (runner.launch.control): a single run has none
        name = resolved["control"].get("name")
        print(
            f"warning: control={name} is timed beside a sweep's jobs (-m): this single run times none", file=sys.stderr
        )
    built = check_settings(resolved)
    if built is not None:
        check_fits(resolved, *built)


def sweep_refusal(cfg: DictConfig) -> str | None:
    """What refuses a sweep's job before anything runs, in one line; None where it can run, or where only the
    combination rules refuse it (its own turn records that, beside the other jobs)."""
    from runner.config import check_combination, check_model_arguments, check_task_arguments
    from runner.models import check_known_wrong
    from runner.record.naming import described

    try:
        resolved = described(cfg, strict=True)
        check_model_arguments(resolved["model"])
        check_task_arguments(resolved["task"])
    except ConfigError as error:
        return str(error)
    try:
        check_combination(resolved)
        check_known_wrong(resolved["model"], _choices(resolved))
    except ConfigError:
        return None
    try:
        check_settings(resolved)
    except ConfigError as error:
        return str(error)
    return None


def check_settings(cfg: Mapping) -> tuple[Any, Any] | None:
    """The model's own settings (model.heads=3 beside d_model 64, model.n=-5), a built-in task's against it
    (task.new_tokens=0, task.prompt_lengths beyond model.prompt_len) and its data's fit (data=image with model=mlp),
    checked by building the workload where that imports no framework: refused in a second, not after the framework
    loaded and a FAILED run was written. Returns the workload and the task, where both were built."""
    from runner.config import class_named
    from runner.measure.data import check_source
    from runner.models import build_workload
    from runner.tasks import build_task

    built_in = str(cfg["task"].get("_target_", "")).startswith("runner.tasks.")  # a user's own: built in its job
    task = build_task(cfg["task"]) if built_in else None
    if not getattr(class_named("model._target_", cfg["model"]["_target_"]), "builds_without_framework", False):
        return None
    try:
        workload = build_workload(cfg["model"])
    except ConfigError:
        raise
    except Exception:  # a user's workload that builds only beside its backend: the job builds it and says why
        return None
    check_source(cfg["data"], workload)
    if task is None:
        return None
    task.check(workload)
    return workload, task


def check_fits(cfg: Mapping, workload: Any, task: Any) -> None:
    """A single run's arrays against the memory free now (runner.measure.limits' estimate, which the job checks again
    on the device its backend resolves): model=matmul model.n=300000 refused in a second, not after the framework
    loaded with a FAILED run. A sweep's jobs are checked in their turn, against the memory free then."""
    from runner.config import nvidia_driver_present
    from runner.measure import limits

    c, batch = _choices(cfg), cfg["batch_size"]
    elements = task.array_elements(workload, batch, bool(cfg["mode"]["per_example"]))
    if elements is None:  # a workload that states no sizes
        return
    device = c["device"]
    if device == "auto":
        device = "cuda" if "cuda" in cfg["backend"]["devices"] and nvidia_driver_present() else "cpu"
    reference = bool(cfg["check_reference"]) and workload.numpy_reference
    needed = limits.memory_needed(elements, limits.ITEMSIZE[c["dtype"]], device, reference)
    what = "inputs, weights, results" + (", activations" if elements.get("activations") else "")
    label = f"model={c['model']} {task.size_setting(workload, batch)} dtype={c['dtype']}"
    limits.check_memory(label, *needed, device, what)


def _choices(cfg: Mapping) -> dict[str, str]:
    from runner.config import choices

    return choices(cfg)


def path_in_choice(parsed: list, config_dir: Path) -> str | None:
    """A config group's value that walks the config folder (backend=../backend/numpy, model=mlp/../mlp): Hydra takes
    the option it lands on, and the record keeps what was typed. One line naming the group's options."""
    for override in parsed:
        group = override.key_or_group
        if "/" in group or not (config_dir / group).is_dir():
            continue
        try:
            values = list(override.sweep_string_iterator()) if override.is_sweep_override() else [override.value()]
        except Exception:  # noqa: BLE001 - a sweep only Hydra expands (glob): its values are options already
            continue
        for value in values:
            if any(part in (".", "..") for part in str(value).split("/")):
                options = ", ".join(sorted(p.stem for p in (config_dir / group).glob("*.yaml")))
                return f"{group}={value}: name a {group}, not a path (allowed {group}: {options})"
    return None


def jobs(overrides: list[str], params: Mapping[str, Any] | None) -> list[list[str]] | None:
    """Each job's overrides, in the order Hydra's basic sweeper launches them; None where a sweep is of a kind only
    Hydra expands (glob, an interval)."""
    lines = [f"{key}={value}" for key, value in (params or {}).items()] + list(overrides)
    try:
        parsed = OverridesParser.create().parse_overrides(lines)
        choices: dict[str, list[str]] = {}
        for override in parsed:
            key = override.get_key_element()
            if override.is_sweep_override():
                choices[key] = [f"{key}={value}" for value in override.sweep_string_iterator()]
            else:
                choices[key] = [f"{key}={override.get_value_element_as_str()}"]
    except Exception:  # noqa: BLE001 - not a sweep expanded here: Hydra expands it, and its jobs are checked in turn
        return None
    return [list(job) for job in product(*choices.values())]


def named(index: int, job: list[str], every: list[list[str]]) -> str:
    """'job 3 (backend=numpy model.n=-5)': its number in the sweep folder, and its values of what the sweep varies."""
    varied = [line for line in job if any(line not in other for other in every)]
    return f"job {index} ({' '.join(varied)})" if varied else f"job {index}"


class JobConfigs:
    """Each job's composed config, made from the first job's (`first`, composed from `lines`) without composing
    the whole config again for each job (~0.5-1 s each on 2 cores): a config group's value is composed once, and its
    top-level nodes that differ from the first job's are put in; a plain value is set as Hydra sets it. A job whose
    values cannot be put in so (two groups changing one node, a key the job's group does not have) is composed whole."""

    def __init__(self, first: DictConfig, lines: list[str], config_dir: Path, compose: Callable[[list[str]], Any]):
        self.first, self.lines, self.config_dir, self.compose = first, lines, config_dir, compose
        self.changes: dict[str, dict[str, Any] | None] = {}
        self.parsed: dict[str, Any] = {}  # each line parsed once: a sweep's jobs share their values

    def of(self, job: list[str]) -> DictConfig:
        from omegaconf import OmegaConf, open_dict, read_write

        cfg = copy.deepcopy(self.first)
        changed: set[str] = set()
        values: list = []
        for line in (line for line in job if line not in self.lines):
            if line not in self.parsed:
                self.parsed[line] = OverridesParser.create().parse_overrides([line])[0]
            override = self.parsed[line]
            if self._plain(override):
                values.append(override)
                continue
            nodes = self._nodes(line, override) if self._group(override) else None
            if nodes is None or changed & set(nodes):
                return self.compose(job)
            changed |= set(nodes)
            with open_dict(cfg):
                for key, node in nodes.items():
                    cfg[key] = copy.deepcopy(node)
        try:
            for override in values:
                OmegaConf.update(cfg, override.key_or_group, override.value(), merge=True)
        except Exception:  # noqa: BLE001 - composed whole: Hydra's composition says what is wrong
            return self.compose(job)
        if "hydra" in cfg:  # the model settings the job types (runner.record.naming.typed_model_keys)
            with read_write(cfg.hydra), open_dict(cfg.hydra):
                cfg.hydra.overrides.task = job
        return cfg

    def _plain(self, override) -> bool:
        from omegaconf import DictConfig, ListConfig, OmegaConf

        if self._group(override) or override.type.name != "CHANGE" or override.package is not None:
            return False
        missing = object()
        current = OmegaConf.select(self.first, override.key_or_group, default=missing)
        return current is not missing and not isinstance(current, DictConfig | ListConfig)

    def _group(self, override) -> bool:
        key = override.key_or_group
        chosen = override.type.name in ("CHANGE", "ADD") and override.package is None and "/" not in key
        return chosen and (self.config_dir / key).is_dir()

    def _nodes(self, line: str, override) -> dict[str, Any] | None:
        """The top-level nodes a group's value sets that differ from the first job's, composed once per value."""
        if line not in self.changes:
            key = line.split("=", 1)[0]
            old = next((i for i, kept in enumerate(self.lines) if kept.split("=", 1)[0] == key), None)
            variant = list(self.lines) if old is None else [*self.lines[:old], line, *self.lines[old + 1 :]]
            if old is None:
                variant.append(line)
            cfg = self.compose(variant)
            removed = [k for k in self.first if k != "hydra" and k not in cfg]
            differ = {k: cfg[k] for k in cfg if k != "hydra" and cfg.get(k) != self.first.get(k)}
            self.changes[line] = None if removed else differ
        return self.changes[line]

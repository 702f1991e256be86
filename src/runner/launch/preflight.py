"""Validate command-line overrides before Hydra starts, so bad input costs one clear line.

Hydra's own composition errors span many lines; here the overrides (each sweep at its first value) are composed
once against the structured configs, each other value of a sweep checked (a config group's value composed again,
a plain value set in that config), and the first failure is reported as one line.
"""

from __future__ import annotations

import copy
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple, cast

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import MissingConfigException
from hydra.types import RunMode

from runner.config import CONFIG_DIR, ConfigError, check_values, compose, first_line
from runner.launch import job_checks, where_it_runs
from runner.launch.composition_errors import composition_message, missing_option, nearest_hint, settings_of

if TYPE_CHECKING:
    from omegaconf import DictConfig

MULTIRUN_FLAGS = ("-m", "--multirun")
HYDRA_KEYS_CHECKED = ("hydra.searchpath", "hydra.run.dir", "hydra.sweep.dir")


class BadInput(ValueError):
    """One-line description of a bad override."""


class Checked(NamedTuple):
    """The config check_argv composed, and whether it composed the command line as typed (no sweep, no Hydra
    setting left out): then it is the config Hydra would compose for the run (runner.launch.single_run)."""

    cfg: DictConfig
    as_given: bool


def check_argv(argv: list[str], config_dir: Path = CONFIG_DIR) -> DictConfig | None:
    """Raise BadInput for the first override that cannot compose. Other Hydra flags are left alone. Returns the
    config of the run (of a sweep: of its first job) with its `hydra` node, None where Hydra's flags were left."""
    checked = check(argv, config_dir)
    return None if checked is None else checked.cfg


def check(argv: list[str], config_dir: Path = CONFIG_DIR) -> Checked | None:
    """check_argv's config, and whether it is the run's own (Checked)."""
    if any(arg.startswith("-") and arg not in MULTIRUN_FLAGS for arg in argv):
        return None  # --help, --cfg, -c job ... : Hydra's own business
    overrides = [arg for arg in argv if arg not in MULTIRUN_FLAGS]
    parsed = _parse(overrides)
    sweeps = _experiment_sweeps(parsed, config_dir)
    if sweeps:
        parsed = _parse(overrides + sweeps)
    if line := where_it_runs.problem(parsed, os.environ):
        raise BadInput(line)
    _refuse_choice_names(parsed)
    if line := job_checks.path_in_choice(parsed, config_dir):
        raise BadInput(line)
    base = [o.input_line for o in parsed if not _is_hydra(o.key_or_group) or o.key_or_group in HYDRA_KEYS_CHECKED]
    composed = _singles(base, parsed)
    cfg = _compose(composed, config_dir, return_hydra_config=True)  # the first job's: each sweep's first value
    multirun = any(arg in MULTIRUN_FLAGS for arg in argv) or cfg.hydra.mode == RunMode.MULTIRUN
    sweep = _jobs(overrides, cfg) if multirun else None
    if sweep is None:
        _check_values(cfg, parsed, base, config_dir)
    _warn_unread(parsed, cfg)
    _check_added(parsed, cfg)
    _prepare_environments(cfg, parsed)
    if sweep is not None:
        _check_jobs(cfg, sweep, config_dir)
    elif not multirun:
        _check_combination(cfg)
    key = "sweep" if multirun else "run"
    check_writable(f"hydra.{key}.dir", str(cfg.hydra[key].dir))
    return Checked(cfg, as_given=not multirun and composed == overrides)


def _check_values(cfg: DictConfig, parsed: list, base: list[str], config_dir: Path) -> None:
    """Each value of each sweep (a sweep Hydra expands itself, or one typed without -m) composes."""
    for override in parsed:
        if _is_hydra(override.key_or_group) or not override.is_sweep_override():
            continue
        for value in override.sweep_string_iterator():
            if _checked_as_value(cfg, override, value, config_dir):
                continue
            variant = list(base)
            variant[base.index(override.input_line)] = f"{_prefix(override)}{override.key_or_group}={value}"
            _compose(_singles(variant, parsed), config_dir)


def _check_combination(cfg: DictConfig) -> None:
    """A single run's choices that cannot run together (runner.config.check_combination) and its settings, refused
    here: before a worker starts or a framework is imported, and with nothing recorded (runner.launch.job_checks)."""
    try:
        job_checks.check_single(cfg)
    except ConfigError as error:
        raise BadInput(str(error)) from None


def _jobs(overrides: list[str], cfg: DictConfig) -> list[list[str]] | None:
    """A sweep's jobs as Hydra's basic sweeper makes them (the overrides preflight composes: Hydra's own settings
    left to Hydra); None where another sweeper chooses the jobs (Optuna's, as it goes), or Hydra expands the sweep."""
    if cfg.hydra.sweeper.get("_target_") != job_checks.BASIC_SWEEPER:
        return None
    every = job_checks.jobs(overrides, cfg.hydra.sweeper.get("params"))
    if every is None:
        return None
    return [[line for line in job if _kept(line)] for job in every]


def _kept(line: str) -> bool:
    key = line.split("=", 1)[0].lstrip("+~")
    return not _is_hydra(key) or key in HYDRA_KEYS_CHECKED


def _check_jobs(cfg: DictConfig, jobs: list[list[str]], config_dir: Path) -> None:
    """Every job of a sweep: its values compose, and its settings are refused before any job runs (the whole sweep,
    in one line naming the job); choices that cannot run together are left to the job's turn."""
    configs = job_checks.JobConfigs(cfg, jobs[0], config_dir, lambda job: _compose(job, config_dir))
    checked: set[tuple[str, ...]] = set()
    for index, job in enumerate(jobs):
        if tuple(job) in checked:  # jobs that differ in Hydra's settings alone
            continue
        checked.add(tuple(job))
        job_cfg = configs.of(job)
        try:
            _check(job_cfg)
        except ConfigError as error:
            _compose(job, config_dir)  # composed whole: the value's own words
            raise BadInput(str(error)) from None
        if line := job_checks.sweep_refusal(job_cfg):
            raise BadInput(f"{job_checks.named(index, job, jobs)}: {line}")


def _checked_as_value(cfg: DictConfig, override, value: str, config_dir: Path) -> bool:
    """A swept value of a key that holds a value (seed, timing.max_time_s), not a config group, set in the first
    job's config as Hydra sets it (OmegaConf.update) and checked there: composing the whole config again for each
    value (~0.3 s on 2 cores) would tell nothing more. False where that cannot be done here or the value fails:
    the value's own composition then decides, and words the failure."""
    from omegaconf import DictConfig, ListConfig, OmegaConf

    key = override.key_or_group
    if override.type.name != "CHANGE" or override.package is not None or "/" in key:
        return False
    if (config_dir / key.replace(".", "/")).is_dir():
        return False
    missing = object()
    current = OmegaConf.select(cfg, key, default=missing)
    if current is missing or isinstance(current, DictConfig | ListConfig):  # not a plain value of this config
        return False
    try:
        job = copy.deepcopy(cfg)
        OmegaConf.update(job, key, _parse([f"{key}={value}"])[0].value(), merge=True)
        _check(job)
    except Exception:  # noqa: BLE001 - composed in full instead, which words the failure
        return False
    return True


ENVIRONMENT_KEYS = ("environment.with", "environment.python", "environment.find_links")


def _prepare_environments(cfg: DictConfig, parsed: list) -> None:
    """Each Python environment the jobs ask for (environment.*, each sweep's every value), built now where it is not
    yet (runner.launch.environments): one that cannot be resolved or built, or an interpreter of the user's own that
    cannot run the job, is refused here, before anything is written."""
    from itertools import product

    from omegaconf import OmegaConf

    from runner.launch import environments

    base = cast(dict, OmegaConf.to_container(cfg.environment, resolve=True)) if cfg.get("environment") else {}
    swept = {
        o.key_or_group.split(".", 1)[1]: [
            _parse([f"{o.key_or_group}={v}"])[0].value() for v in o.sweep_string_iterator()
        ]
        for o in parsed
        if o.key_or_group in ENVIRONMENT_KEYS and o.is_sweep_override()
    }
    for values in product(*swept.values()):
        settings = {**base, **dict(zip(swept, values, strict=True))}
        try:
            environments.check_environment(settings, str(cfg.isolation))
            environment = environments.ready(settings, say=lambda line: print(line, file=sys.stderr))
            if environment is not None and settings.get("python"):
                for module in _backend_modules(cfg, parsed):
                    environments.check_runs(environment, module)
        except ConfigError as error:
            raise BadInput(str(error)) from None


def _backend_modules(cfg: DictConfig, parsed: list) -> list[str]:
    """The backend modules of the jobs: the first job's, and each value of a sweep over backend=."""
    from omegaconf import OmegaConf

    modules = [str(cfg.backend.module)]
    for override in (o for o in parsed if o.key_or_group == "backend" and o.is_sweep_override()):
        for name in override.sweep_string_iterator():
            modules.append(str(OmegaConf.load(CONFIG_DIR / "backend" / f"{name}.yaml").module))
    return list(dict.fromkeys(modules))


def check_writable(key: str, folder: str) -> None:
    """The folder can be created (or is there) and written: a read-only place is one line, not a traceback."""
    if line := where_it_runs.folder_problem(key, folder):
        raise BadInput(line)


def _parse(overrides: list[str]) -> list:
    try:
        return OverridesParser.create().parse_overrides(overrides)
    except Exception as error:
        raise BadInput(f"cannot parse overrides: {first_line(error)}") from None


def _experiment_sweeps(parsed: list, config_dir: Path) -> list[str]:
    """The sweeps an experiment file declares (hydra.sweeper.params) that the command line does not replace:
    a job composes with them, so `+experiment=X model.size=1` is checked with the model X's sweep picks."""
    experiments = [o.input_line for o in parsed if o.key_or_group == "experiment"]
    if not experiments:
        return []
    try:
        params = compose(experiments, config_dir, return_hydra_config=True).hydra.sweeper.get("params") or {}
    except Exception:  # a bad experiment name: reported when the whole list is composed
        return []
    given = {o.key_or_group for o in parsed}
    return [f"{key}={value}" for key, value in params.items() if key.lstrip("+") not in given]


def _refuse_choice_names(parsed: list) -> None:
    """`tracking.name=x` would rename the chosen group, not choose another: only the group's own override does."""
    from runner.config import GROUPS

    for override in parsed:
        group, _, key = override.key_or_group.partition(".")
        if group in GROUPS and key == "name":
            raise BadInput(
                f"{override.input_line}: {group}.name says which {group} was chosen, it is not a setting; "
                f"choose with {group}=NAME (python run.py --help lists them)"
            )


def _warn_unread(parsed: list, cfg) -> None:
    """One warning naming the data and optimizer settings typed on the command line that the chosen run does not
    read (runner.identity.applies: `data.image_size` on the MLP, `data.path` with random inputs, an
    optimizer for a task that trains nothing)."""
    from omegaconf import OmegaConf

    from runner.identity import applies

    config = cast(dict, OmegaConf.to_container(cfg, resolve=False))  # a DictConfig's container is a dict
    unread = [
        o.input_line
        for o in parsed
        if o.key_or_group.startswith(("data.", "optimizer")) and not applies(o.key_or_group, config)
    ]
    if unread:
        print(
            f"warning: this run does not read {', '.join(unread)}: its task, model and data have no use for it",
            file=sys.stderr,
        )


def _check_added(parsed: list, cfg) -> None:
    """A key added with `+` (or `++`) that the run has no setting for, with the nearest name it has: refused where a
    built-in model or task would be handed it (its constructor takes exactly its yaml's settings), warned elsewhere
    (`+batchsize=8` beside batch_size). A key added to a user's own model or task is theirs to read."""
    from omegaconf import OmegaConf

    from runner.config import RunConfig

    for override in parsed:
        key = override.key_or_group
        if override.type.name not in ("ADD", "FORCE_ADD") or _is_hydra(key) or OmegaConf.select(cfg, key) is None:
            continue  # not an added key (a config group added: +experiment=NAME)
        parent, _, name = key.rpartition(".")
        node = OmegaConf.select(cfg, parent) if parent else cfg
        known = settings_of(node, leaving=name)
        if not parent and (override.type.name == "ADD" or name not in RunConfig.__dataclass_fields__):
            known = [k for k in known if k in RunConfig.__dataclass_fields__]
        elif parent not in ("model", "task") or name in _built_in_settings(node, parent):
            continue
        hint = nearest_hint(key, known)
        if parent in ("model", "task") and str(node.get("_target_", "")).startswith("runner."):
            raise BadInput(
                f"{override.input_line}: {parent}={node.name} has no setting {name} (its settings: "
                f"{', '.join(known) or 'none'}){hint}"
            )
        if not parent:
            print(f"warning: {override.input_line} adds a key no setting of the runner has{hint}", file=sys.stderr)


def _built_in_settings(node, group: str) -> set[str]:
    """The settings a built-in model or task declares (conf/GROUP/NAME.yaml's keys); none for a user's own."""
    from omegaconf import OmegaConf

    path = CONFIG_DIR / group / f"{node.get('name')}.yaml"
    if not str(node.get("_target_", "")).startswith("runner.") or not path.is_file():
        return set()
    return {str(k) for k in OmegaConf.load(path)}


def _singles(lines: list[str], parsed) -> list[str]:
    """Replace each remaining sweep by its first value, so the list composes as one job."""
    out = []
    for line in lines:
        override = next((o for o in parsed if o.input_line == line), None)
        if override is not None and override.is_sweep_override():
            first = next(iter(override.sweep_string_iterator()))
            line = f"{_prefix(override)}{override.key_or_group}={first}"
        out.append(line)
    return out


def _prefix(override) -> str:
    return {"ADD": "+", "FORCE_ADD": "++", "DEL": "~"}.get(override.type.name, "")


def _is_hydra(key: str) -> bool:
    return key == "hydra" or key.startswith(("hydra.", "hydra/"))


def _compose(overrides: list[str], config_dir: Path, return_hydra_config: bool = False):
    """The composed config, its values checked (runner.config.check_values, the tracking store's path)."""
    try:
        cfg = compose(overrides, config_dir, return_hydra_config=return_hydra_config)
        _check(cfg)
        return cfg
    except ConfigError as error:
        raise BadInput(str(error)) from None
    except MissingConfigException as error:
        raise BadInput(missing_option(error)) from None
    except Exception as error:
        raise BadInput(composition_message(error, overrides, config_dir)) from None


def _check(cfg: DictConfig) -> None:
    from runner.tracking import check_store_path

    check_values(cfg)
    if cfg.tracking.name != "none":
        try:
            check_store_path(cfg.tracking.uri)
        except OSError as error:  # a name longer than the file system takes
            raise ConfigError(f"tracking.uri={cfg.tracking.uri}: {error.strerror}") from None


def main(argv: list[str] | None = None) -> Checked | None:
    """Exit with status 2 and one line on stderr when the overrides cannot compose; else what check() returns."""
    try:
        return check(sys.argv[1:] if argv is None else argv)
    except BadInput as error:
        print(f"error: {error}", file=sys.stderr)
        raise SystemExit(2) from None

"""What identifies a run: its params (the flattened config keys that apply to it), its name, a sweep's
swept keys and title. Used with and without MLflow (runner report reads run directories)."""

from __future__ import annotations

import functools
import re
from collections.abc import Collection
from pathlib import Path
from typing import TYPE_CHECKING, cast

from runner.identity import config_params, flatten, under
from runner.spec import JobSpec

if TYPE_CHECKING:
    from omegaconf import DictConfig


def run_params(config: dict, copied: Collection[str]) -> dict[str, str]:
    """The run's parameters as a person reads them: the flattened config keys that apply to its model, data and
    mode (config_params), in words rather than Python: `threads` left unset is `framework default` (not `None`),
    any other unset key is left out, the per-sample series are one param naming them (`timing.series` =
    'sample_cpu_mhz, sample_end_unix_s, ...', not a class path per series), and no `_target_` class path. The
    whole resolved config stays in result.json and the Hydra artifacts."""
    params: dict[str, str] = {}
    series = []
    for key, value in config_params(config, copied).items():
        if key.startswith(SERIES_PREFIX):
            series.append(key.removeprefix(SERIES_PREFIX))
        elif key.endswith(TARGET):
            continue  # the class its name stands for (task._target_ beside task.name): Python, not a setting
        elif value != "None":
            params[key] = value
        elif key in UNSET_SAID:
            params[key] = UNSET_SAID[key]
    if series:
        params[SERIES_PREFIX.rstrip(".")] = ", ".join(series)
    return params


TARGET = "._target_"
SERIES_PREFIX = "timing.series."  # name -> a Series class path: the names are what a person reads
UNSET_SAID = {"threads": "framework default"}  # an unset (None) key that says something; others are left out


PLAIN_INTERPOLATION = re.compile(r"\$\{(\.*)([\w-]+(?:\.[\w-]+)*)\}")  # ${data.image_size}, ${.x}; no resolver


def copied_keys(cfg: DictConfig) -> dict[str, str]:
    """Each flattened key whose value is written as exactly another key of the config (`${data.image_size}`)
    -> that key. Read from the unresolved config: resolving erases the interpolation. A resolver
    (`${now:...}`), text around an interpolation, or a key outside the run's config (`${hydra.job.num}`)
    makes a value of its own, which stays a param."""
    from omegaconf import OmegaConf

    raw = flatten(cast(dict, OmegaConf.to_container(cfg, resolve=False)))  # a DictConfig's container is a dict
    copies = {}
    for key, value in raw.items():
        match = PLAIN_INTERPOLATION.fullmatch(value)
        target = _absolute(key, *match.groups()) if match else None
        if target and any(under(other, (target,)) for other in raw):
            copies[key] = target
    return copies


def job_spec(cfg: DictConfig) -> JobSpec:
    """The job's spec, with the keys that copy another (read before resolving erases them) and the model's settings
    that its checkpoint's config.json sets (`described`)."""
    return JobSpec.of(described(cfg), copied_keys(cfg))


def described(cfg: DictConfig, strict: bool = False) -> DictConfig:
    """cfg with the model settings that model.weights=FOLDER's config.json sets where the run leaves them at its
    workload's defaults and its command line does not type them (runner.models.checkpoints.from_checkpoint); `strict`:
    a setting the run names that disagrees is refused (ConfigError), else left for the job's own check to refuse."""
    import copy

    from omegaconf import open_dict

    from runner.config import plain
    from runner.models.checkpoints import from_checkpoint

    model = cfg.get("model")
    if not model or not model.get("weights") or "_target_" not in model:
        return cfg
    settings = from_checkpoint(plain(model), typed_model_keys(cfg), strict)
    if not settings:
        return cfg
    cfg = copy.deepcopy(cfg)
    with open_dict(cfg.model):
        for key, value in settings.items():
            cfg.model[key] = value
    return cfg


def typed_model_keys(cfg: DictConfig) -> list[str]:
    """The model settings the run's command line types (`model.ffn=176`: ffn), from Hydra's overrides of the job: in
    the config where it has its `hydra` node, else Hydra's current one; none where neither is (a test's compose)."""
    from hydra.core.hydra_config import HydraConfig

    if "hydra" in cfg:
        overrides = list(cfg.hydra.overrides.task)
    else:
        overrides = list(HydraConfig.get().overrides.task) if HydraConfig.initialized() else []
    keys = (override.split("=", 1)[0].lstrip("+~") for override in overrides)
    return [key.split(".")[1] for key in keys if key.startswith("model.")]


def _absolute(key: str, dots: str, target: str) -> str:
    """The key a relative interpolation names: `${.x}` a sibling of `key`, each further dot one level up."""
    if not dots:
        return target
    parents = key.split(".")[:-1]
    return ".".join([*parents[: max(len(parents) + 1 - len(dots), 0)], target])


NAME_GROUPS = ("backend", "model", "task", "mode", "device", "dtype")
SWEEP_SYNTAX = (",", "range(", "choice(", "interval(", "glob(")


def run_name(config: dict, swept: dict[str, str] | None = None, job: str | None = None) -> str:
    """'numpy-mlp-gradients-eager-cpu-float32' for a single run ('...-float32-bf16_mixed' under a precision policy
    other than full; a training step names its optimizer: 'torch-mlp-train_step(adam)-eager-cpu-float32'). A
    sweep's job names what the sweep varies first, then the rest and its number: 'jax · seed=0 ·
    mlp-gradients-eager-cpu-float32 #4', a swept group by its choice alone ('torch', 'adam'; 'precision=full',
    whose choice alone would not say what it is) and a key by its last part ('lr=0.1' for optimizer.lr), so the ~16
    characters a runs list shows tell jobs apart; unique within a sweep, and apart from single runs."""
    swept = swept or {}
    varied = [_varied(config, k, v) for k, v in swept.items()]
    parts = [_part(config, key, swept) for key in NAME_GROUPS if key not in swept]
    if choice(config, "precision") not in (None, "full") and "precision" not in swept:
        parts.append(str(choice(config, "precision")))  # a policy other than the default one says so
    rest = "-".join(parts)
    name = " · ".join([*varied, rest] if rest else varied)
    return " ".join([name, *([f"#{job}"] if job is not None else [])])


def _part(config: dict, key: str, swept: dict[str, str]) -> str:
    """A group's choice in a run's name; a task with the groups it reads (a training step's optimizer: what its time
    depends on beside the model), unless the sweep varies that group and says it first."""
    said = str(choice(config, key))
    if key == "task":
        said += "".join(f"({value})" for group, value in read_by_task(config).items() if group not in swept)
    return said


def read_by_task(config: dict) -> dict[str, str]:
    """The groups a run's task reads, by their choice: {'optimizer': 'adam'} for a training step, whose node holds
    `${optimizer}`; {} for a task that reads none."""
    task = config.get("task") or {}
    return {str(k): str(v["name"]) for k, v in task.items() if isinstance(v, dict) and "name" in v}


BARE = (*NAME_GROUPS, "optimizer", "model.arch")  # swept, a value that says what it is: torch, adam, MobileNetV2


def _varied(config: dict, key: str, value: str) -> str:
    """A swept key as a job's name says it: by its value where that says what it is ('torch', 'adam'), else by its
    last part and value ('seed=1', 'lr=0.1', 'precision=full': 'full' alone would not say what is full)."""
    said = choice(config, key) if isinstance(config.get(key), dict) or key in NAME_GROUPS else value
    return str(said) if key in BARE else f"{key.rsplit('.', 1)[-1]}={said}"


def swept_keys(overrides: list[str], sweeper_params: dict | None = None) -> dict[str, str]:
    """What a sweep varies, key -> values: command-line overrides with sweep syntax, then the sweeper's
    own params (an experiment file's hydra.sweeper.params) that the command line did not replace."""
    swept = dict(split_override(o) for o in overrides)
    swept = {k: v for k, v in swept.items() if any(t in v for t in SWEEP_SYNTAX)}
    for key, values in (sweeper_params or {}).items():
        key = key.lstrip("+~")
        if key not in swept and any(t in str(values) for t in SWEEP_SYNTAX):
            swept[key] = str(values)
    return swept


def sweep_title(info: dict) -> str:
    """'sweep backend=numpy,torch × mode=eager,function': a parent run named by what it sweeps, and by what it
    timed where that is not the default ('sweep of train_step (adam) on mlp: backend=torch,tensorflow')."""
    swept = swept_keys(info.get("overrides", []), info.get("sweeper_params"))
    varied = " × ".join(f"{k}={v}" for k, v in swept.items()) or Path(info["sweep_dir"]).name
    return f"sweep of {info['timed']}: {varied}" if info.get("timed") else f"sweep {varied}"


# The groups a task may read (its node holds ${GROUP}: a training step's optimizer). A run's params hold one only
# where its task reads it (runner.identity.applies); in a composed config, read_by_task says which.
READ_BY_TASKS = ("optimizer",)
TIMED_GROUPS = ("task", *READ_BY_TASKS, "model", "precision")  # what a sweep's title and answer name when not default


def what_was_timed(fixed: dict[str, object]) -> str:
    """What a sweep (or a set of runs) timed, where it fixed a task, optimizer, model or precision other than the
    defaults of conf/config.yaml: 'train_step (adam) on mlp', 'inference on resnet', 'gradients on mlp in bf16_mixed
    precision'; '' where each is the default or varies. `fixed`: a group (TIMED_GROUPS) -> its one choice; a group of
    READ_BY_TASKS only where the task reads it."""
    chosen = {g: str(v) for g, v in fixed.items() if g in TIMED_GROUPS and v not in (None, "", "None", "nan")}
    defaults = _group_defaults()
    if all(defaults.get(g) == v for g, v in chosen.items()):
        return ""
    task = chosen.get("task", "")
    if "optimizer" in chosen:
        task += f" ({chosen['optimizer']})"
    said = " on ".join(part for part in (task, chosen.get("model", "")) if part)
    if chosen.get("precision", defaults.get("precision")) != defaults.get("precision"):
        said += f" in {chosen['precision']} precision"
    return said.strip()


@functools.cache
def _group_defaults() -> dict[str, str]:
    """The default choice of each group, as conf/config.yaml's defaults list names it (task: gradients, ...)."""
    from omegaconf import OmegaConf

    from runner.locations import CONFIG_DIR

    config = cast(dict, OmegaConf.to_container(OmegaConf.load(CONFIG_DIR / "config.yaml")))  # a mapping's: a dict
    entries = config.get("defaults", [])
    return {str(k): str(v) for e in entries if isinstance(e, dict) for k, v in e.items() if k in TIMED_GROUPS}


def job_context(run_dir: Path) -> tuple[dict[str, str], str | None]:
    """For a sweep's job: its value of each swept key (from its .hydra/overrides.yaml) and its number."""
    from runner.record.sweep_file import read_sweep_file

    info, overrides_path = read_sweep_file(run_dir.parent), run_dir / ".hydra" / "overrides.yaml"
    if not info or not overrides_path.exists():
        return {}, None
    from omegaconf import OmegaConf

    job_values = dict(split_override(str(o)) for o in OmegaConf.load(overrides_path))
    swept = swept_keys(info.get("overrides", []), info.get("sweeper_params"))
    return {k: job_values.get(k, "?") for k in swept}, run_dir.name


def choice(config: dict, key: str):
    """A group's chosen name (or a plain key's value) in a resolved config."""
    value = config.get(key)
    return value.get("name") if isinstance(value, dict) else value


def split_override(override: str) -> tuple[str, str]:
    key, _, value = override.partition("=")
    return key.lstrip("+~"), value[:6000]

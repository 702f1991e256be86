"""Checkpoints as users have them: a weights file (runner.models.weights reads torch, safetensors and HDF5 files, each
told by its content), or a Hugging Face folder as `save_pretrained` writes it: `config.json` beside `model.safetensors`,
`pytorch_model.bin`, or their shards listed in `model.safetensors.index.json` / `pytorch_model.bin.index.json`.

`strict_weights` matches a checkpoint against a workload's spec ({name: shape}) and accounts for every key: the
model's names are looked up as they are or under ONE known prefix (`transformer.` for HF's GPT2LMHeadModel, `model.`
for its Llama), stripped from every key under it, and each key must then be a weight of the spec, a buffer the
workload says is no weight, or a tied copy equal to the weight it is tied to. A missing weight, a shape or dtype that
disagrees, a key of no use, a tied copy that differs: each is refused in one line naming the key and the file, so a
run never drops weights silently. `config.json` is the workload's to check (it knows what the sizes mean), through
`check_config`: a size that is not the run's, or arithmetic the model does not compute, is one line naming the key,
both values and the file.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from runner.config import ConfigError
from runner.models.weights import NUMERIC_KINDS, read_arrays

KNOWN_PREFIXES = ("transformer.", "model.")
# What a Hugging Face folder holds its weights in, in the order transformers' from_pretrained prefers them
FOLDER_FILES = (
    "model.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
)


@dataclass(frozen=True)
class Checkpoint:
    """Every tensor of a checkpoint by its key, the file each came from, and a folder's config.json."""

    arrays: dict[str, np.ndarray]
    files: dict[str, Path]  # key -> the file holding it (a shard of a sharded folder)
    weights_file: Path  # the file (or the shards' index) that a message names for the checkpoint as a whole
    config: dict[str, Any] | None = None
    config_file: Path | None = None

    def floats(self) -> dict[str, np.ndarray]:
        """The numeric tensors in float64, as runner.models.weights.read_checkpoint gives a file's."""
        return {k: v.astype(np.float64) for k, v in self.arrays.items() if v.dtype.kind in NUMERIC_KINDS}


def read(path: Path) -> Checkpoint:
    """The checkpoint at `path`: a weights file, or a Hugging Face folder."""
    path = Path(path).expanduser()
    if path.is_dir():
        return _read_folder(path)
    arrays = read_arrays(path)
    return Checkpoint(arrays, dict.fromkeys(arrays, path), path)


def _read_folder(folder: Path) -> Checkpoint:
    name = next((name for name in FOLDER_FILES if (folder / name).is_file()), None)
    if name is None:
        held = ", ".join(sorted(p.name for p in folder.iterdir())[:8]) or "nothing"
        raise ConfigError(
            f"{folder} is a folder without a Hugging Face checkpoint ({', '.join(FOLDER_FILES)}): it holds {held}"
        )
    weights = folder / name
    if name.endswith(".index.json"):
        arrays, files = _read_shards(weights)
    else:
        arrays = read_arrays(weights)
        files = dict.fromkeys(arrays, weights)
    config_file = folder / "config.json"
    config = _read_json(config_file) if config_file.exists() else None
    return Checkpoint(arrays, files, weights, config, config_file if config is not None else None)


def _read_shards(index: Path) -> tuple[dict[str, np.ndarray], dict[str, Path]]:
    """Every shard the index names, each key from one shard only, and each where the index places it."""
    weight_map = _read_json(index).get("weight_map")
    if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
        raise ConfigError(f"{index} has no weight_map of names to shard files")
    arrays: dict[str, np.ndarray] = {}
    files: dict[str, Path] = {}
    for shard_name in sorted(set(weight_map.values())):
        if Path(shard_name).name != shard_name:
            raise ConfigError(f"{index} names a shard outside its folder: {shard_name}")
        shard = index.parent / shard_name
        for key, array in read_arrays(shard).items():
            if key in files:
                raise ConfigError(f"{shard}: {key} is in {files[key].name} too")
            arrays[key], files[key] = array, shard
    for key, shard_name in weight_map.items():
        if key not in files or files[key].name != shard_name:
            raise ConfigError(f"{index} places {key} in {shard_name}, which does not hold it")
    return arrays, files


def _read_json(path: Path) -> dict[str, Any]:
    try:
        value = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ConfigError(f"cannot read {path}: {type(error).__name__}: {error}") from None
    if not isinstance(value, dict):
        raise ConfigError(f"{path} holds a JSON {type(value).__name__}, not an object")
    return value


# -- matching a spec ------------------------------------------------------------------------------


def match_spec(loaded: dict[str, np.ndarray], spec: dict[str, tuple], source: Path) -> dict[str, np.ndarray]:
    """The loaded arrays in spec order; one clear line for a missing name or a wrong shape."""
    missing = [name for name in spec if name not in loaded]
    if missing:
        raise ConfigError(f"{source} lacks {len(missing)} weights the model needs, e.g. {', '.join(missing[:3])}")
    for name, shape in spec.items():
        if tuple(loaded[name].shape) != tuple(shape):
            raise ConfigError(f"{source}: {name} has shape {tuple(loaded[name].shape)}, the model needs {tuple(shape)}")
    return {name: loaded[name] for name in spec}


def strict_weights(
    checkpoint: Checkpoint,
    spec: Mapping[str, tuple],
    model: str,
    is_buffer: Callable[[str], bool] = lambda name: False,
    tied: Mapping[str, str] | None = None,
) -> dict[str, np.ndarray]:
    """The spec's weights in float64, in spec order, with every key of the checkpoint accounted for (see the module's
    docstring); `tied` maps a key the model does not hold to the spec's weight it must equal (an untied head)."""
    keys = _model_names(checkpoint, spec, model)  # {model's name: checkpoint key}
    file = checkpoint.files
    for name, shape in spec.items():
        array = checkpoint.arrays[keys[name]]
        if array.dtype.kind != "f":
            raise ConfigError(f"{file[keys[name]]}: {keys[name]} is {array.dtype}, not a floating-point weight")
        if tuple(array.shape) != tuple(shape):
            raise ConfigError(
                f"{file[keys[name]]}: {keys[name]} has shape {tuple(array.shape)}, model={model} needs {tuple(shape)}"
            )
    weights = {name: checkpoint.arrays[keys[name]].astype(np.float64) for name in spec}
    tied = tied or {}
    unused = [key for name, key in keys.items() if name not in spec and name not in tied and not is_buffer(name)]
    if unused:
        listed = ", ".join(unused[:3]) + (", ..." if len(unused) > 3 else "")
        tensors = f"{len(unused)} tensor{'s' if len(unused) != 1 else ''}"
        raise ConfigError(
            f"{file[unused[0]]} holds {tensors} model={model} does not use ({listed}): refused rather "
            "than dropped (a checkpoint of other sizes or another model?)"
        )
    for name, target in tied.items():
        if name in keys and not np.array_equal(checkpoint.arrays[keys[name]], weights[target]):
            raise ConfigError(
                f"{file[keys[name]]}: {keys[name]} differs from {keys[target]}: an untied head, which model={model} "
                f"cannot hold (its head is {target}, tied)"
            )
    return weights


def _model_names(checkpoint: Checkpoint, spec: Mapping[str, tuple], model: str) -> dict[str, str]:
    """{name as the model knows it: the checkpoint's key}: the keys under the prefix the spec's names are found under
    stripped of it, every other key as it is; one line when a weight of the spec is missing."""
    found = {prefix: sum(prefix + name in checkpoint.arrays for name in spec) for prefix in ("", *KNOWN_PREFIXES)}
    prefix = max(found, key=lambda p: found[p])  # the first of equals: no prefix
    keys: dict[str, str] = {}
    for key in checkpoint.arrays:
        name = key.removeprefix(prefix) if prefix else key
        if name in keys:
            raise ConfigError(f"{checkpoint.files[key]} holds both {keys[name]} and {key}: which is {name}?")
        keys[name] = key
    missing = [name for name in spec if name not in keys]
    if missing:
        raise ConfigError(_missing_line(checkpoint, missing, len(spec), model, prefix, found[prefix] > 0))
    return keys


def _missing_line(
    checkpoint: Checkpoint, missing: list[str], needed: int, model: str, prefix: str, found_some: bool
) -> str:
    """What the checkpoint lacks, and where the model's names are when they are under a prefix the runner does not
    strip (or what its keys are, when none of them is found)."""
    where = f" (looked up under the prefix {prefix})" if prefix else ""
    line = (
        f"{checkpoint.weights_file} lacks {len(missing)} of the {needed} weights model={model} needs, "
        f"e.g. {', '.join(missing[:3])}{where}"
    )
    elsewhere = next((key for key in checkpoint.arrays if key.endswith("." + missing[0])), None)
    if elsewhere is not None:
        return (
            f"{line}; it has {elsewhere}: a prefix the runner does not strip (it strips {' or '.join(KNOWN_PREFIXES)})"
        )
    if not found_some:
        return f"{line}; its keys are e.g. {', '.join(list(checkpoint.arrays)[:3]) or 'none'}"
    return line


# -- config.json against the run's settings ---------------------------------------------------------


@dataclass(frozen=True)
class Setting:
    """One setting config.json sets: its key and value as the file has them, the model setting it is, the run's value
    of that setting and the value config.json means for it; `narrows`: the run may take less (positions)."""

    key: str
    shown: Any
    setting: str
    run: Any
    wanted: Any
    narrows: bool = False

    def agrees(self) -> bool:
        return self.run <= self.wanted if self.narrows else self.run == self.wanted


def check_config(source: Path, settings: list[Setting]) -> None:
    """Refuse, in one line naming the file, a config.json whose settings are not the run's: every differing key with
    both values and the overrides that fit it (positions past those it was trained for: their own line)."""
    beyond = next((s for s in settings if s.narrows and not s.agrees()), None)
    if beyond is not None:
        raise ConfigError(
            f"{source}: {beyond.key}={beyond.wanted}, but model.{beyond.setting}={beyond.run}: positions past "
            f"{beyond.wanted} are beyond what the checkpoint was trained for; run with model.{beyond.setting}="
            f"{beyond.wanted} or less"
        )
    differ = [s for s in settings if not s.agrees()]
    if differ:
        sets = ", ".join(dict.fromkeys(f"{s.key}={_shown(s.shown)}" for s in differ))
        runs = ", ".join(f"model.{s.setting}={override(s.run)}" for s in differ)
        wanted = " ".join(f"model.{s.setting}={override(s.wanted)}" for s in differ)
        raise ConfigError(f"{source} sets {sets}, this run {runs}: run with {wanted}")


def check_arithmetic(
    source: Path, model: str, arithmetic: Mapping[str, tuple[Any, tuple, str]], config: Mapping
) -> None:
    """Refuse, in one line, a config.json whose arithmetic the model does not compute: `arithmetic` is {key: (its
    default, the values the model computes, what it computes)}."""
    for key, (default, allowed, computed) in arithmetic.items():
        if config.get(key, default) not in allowed:
            raise ConfigError(f"{source}: {key}={config[key]!r}, but model={model} computes {computed}")


def from_checkpoint(model: Mapping[str, Any], typed: Collection[str], strict: bool) -> dict[str, Any]:
    """The model settings a Hugging Face folder's config.json sets (model.weights=FOLDER), for the workloads that read
    one (`settings_of_config`): those the run leaves at its workload's defaults and does not type (`typed`: the
    model.* keys of its command line), to take config.json's values. A setting the run names that disagrees is
    refused in one line where `strict`, else left as it is (the run's own check refuses it: `check_config`)."""
    folder = Path(str(model.get("weights") or "")).expanduser()
    if not model.get("weights") or not (folder / "config.json").exists():  # a folder there: refused as unreadable
        return {}
    from runner.config import class_named

    try:  # what fails here fails the run's own checks too: in a sweep's job, there, recorded
        workload = class_named("model._target_", model["_target_"])
        describe = getattr(workload, "settings_of_config", None)
        described = describe(_read_json(folder / "config.json"), folder / "config.json") if describe else []
    except ConfigError:
        if strict:
            raise
        return {}
    defaults = _defaults(workload)
    named = set(typed) | {k for k, v in model.items() if k in defaults and v != defaults[k]}
    if strict:
        ran = getattr(workload, "comparable", dict)(model)
        check_config(folder / "config.json", [replace(s, run=ran[s.setting]) for s in described if s.setting in named])
    return {s.setting: s.wanted for s in described if s.setting not in named}


def _defaults(workload: type) -> dict[str, Any]:
    import inspect

    return {name: p.default for name, p in inspect.signature(workload).parameters.items() if p.default is not p.empty}


def override(value: Any) -> str:
    """A value as a Hydra override spells it (true, null, {key:value,...})."""
    if isinstance(value, bool) or value is None:
        return json.dumps(value)
    if isinstance(value, Mapping):
        return "{" + ",".join(f"{k}:{override(v)}" for k, v in value.items()) + "}"
    return str(value)


def _shown(value: Any) -> str:
    return json.dumps(value) if isinstance(value, bool | Mapping) or value is None else str(value)

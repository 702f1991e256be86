"""What identifies a run: its params (the flattened config keys that apply to it), its name, a sweep's
swept keys and title. Used with and without MLflow (runner report reads run directories)."""

from __future__ import annotations

from pathlib import Path

from runner.config import is_capability


def flatten(config: dict, prefix: str = "") -> dict[str, str]:
    """{"a": {"b": 1}} -> {"a.b": "1"}: MLflow params are flat strings."""
    flat: dict[str, str] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.update(flatten(value, f"{name}."))
        else:
            flat[name] = str(value)
    return flat


def run_params(config: dict) -> dict[str, str]:
    """The run's parameters: the flattened config keys that apply to its model, data and mode.

    Left out: capability data (runner.config), where the run was logged (tracking.*), data settings the
    chosen data or model does not read, and model settings that copy another key by interpolation
    (model.image_size = ${data.image_size}, model.backend_module = ${backend.module}). The whole resolved
    config stays in result.json and the Hydra artifacts."""
    flat = flatten(config)
    return {k: v for k, v in flat.items() if _applies(k, config) and not _copies_another_key(k, flat)}


def _copies_another_key(key: str, flat: dict[str, str]) -> bool:
    """model.X whose value is that of the key X names elsewhere (data.X, or X with "_" for "." as backend_module)."""
    if not key.startswith("model."):
        return False
    name = key.removeprefix("model.")
    return any(
        other != key and not other.startswith("model.") and value == flat[key]
        for other, value in flat.items()
        if other == name.replace("_", ".") or other.rsplit(".", 1)[-1] == name
    )


def _applies(key: str, config: dict) -> bool:
    if is_capability(key) or key.startswith("tracking."):
        return False
    data, model = config.get("data") or {}, config.get("model") or {}
    if key == "data.image_size":
        return "image_size" in model  # vision models read it
    if key == "data.path":
        return data.get("name") != "random"
    if key == "data.dataset":
        return data.get("name") == "hdf5"
    return True


NAME_GROUPS = ("backend", "model", "task", "mode", "device", "dtype")
SWEEP_SYNTAX = (",", "range(", "choice(", "interval(", "glob(")


def run_name(config: dict, swept: dict[str, str] | None = None, job: str | None = None) -> str:
    """'numpy-mlp-gradients-eager-cpu-float32', then the job's value of every swept key the groups do
    not already name ('size=1000') and a sweep job's number ('#3'): unique within a sweep, and apart
    from single runs."""
    name = "-".join(str(_choice(config, key)) for key in NAME_GROUPS)
    extra = [f"{_short(k)}={v}" for k, v in (swept or {}).items() if k not in NAME_GROUPS]
    return " ".join([name, *extra, *([f"#{job}"] if job is not None else [])])


def _short(key: str) -> str:
    return key.removeprefix("model.") if key in ("model.size", "model.n", "model.arch", "model.method") else key


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


def sweep_title(note: dict) -> str:
    """'sweep backend=numpy,torch × mode=eager,function': a parent run named by what it sweeps."""
    swept = swept_keys(note.get("overrides", []), note.get("sweeper_params"))
    return "sweep " + (" × ".join(f"{k}={v}" for k, v in swept.items()) or Path(note["sweep_dir"]).name)


def job_context(run_dir: Path) -> tuple[dict[str, str], str | None]:
    """For a sweep's job: its value of each swept key (from its .hydra/overrides.yaml) and its number."""
    from runner.record.sweep_note import read_note

    note, overrides_path = read_note(run_dir.parent), run_dir / ".hydra" / "overrides.yaml"
    if not note or not overrides_path.exists():
        return {}, None
    from omegaconf import OmegaConf

    job_values = dict(split_override(str(o)) for o in OmegaConf.load(overrides_path))
    swept = swept_keys(note.get("overrides", []), note.get("sweeper_params"))
    return {k: job_values.get(k, "?") for k in swept}, run_dir.name


def _choice(config: dict, key: str):
    value = config.get(key)
    return value.get("name") if isinstance(value, dict) else value


def split_override(override: str) -> tuple[str, str]:
    key, _, value = override.partition("=")
    return key.lstrip("+~"), value[:6000]

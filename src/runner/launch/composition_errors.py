"""One line for each way Hydra's composition of the overrides fails (runner.launch.preflight): an option a group
has not, with the options it has; a setting the chosen config has not, with the nearest and the settings it has; else
Hydra's first line with its cause's. A key added with `+` is refused in the same words (preflight._check_added)."""

from __future__ import annotations

import re
from pathlib import Path

from hydra.errors import MissingConfigException

from runner.config import compose, first_line


def missing_option(error: MissingConfigException) -> str:
    """'model=nope', a group's option with no config file -> the options the group has."""
    missing = (error.missing_cfg_file or "").removesuffix(".yaml")
    group, _, value = missing.rpartition("/")
    options = ", ".join(sorted(error.options or []))
    if group:
        return f"{group}={value} is not an option (allowed {group}: {options})"
    return first_line(error)


def settings_of(node, leaving: str = "") -> list[str]:
    """A chosen config's settings as a refusal lists them: not its name, its target or what it supports."""
    return [str(k) for k in node if k != leaving and not str(k).startswith("_") and k not in ("name", "supports")]


def nearest_hint(key: str, settings: list[str]) -> str:
    """'; did you mean timing.max_time_s?' where a setting is near the key's last part, else ''."""
    import difflib

    parent, _, name = key.rpartition(".")
    nearest = difflib.get_close_matches(name, settings, n=1)
    return f"; did you mean {parent + '.' if parent else ''}{nearest[0]}?" if nearest else ""


def _unknown_setting(key: str, overrides: list[str], config_dir: Path) -> str:
    """'model.size=5' on the mlp, 'timing.min_time_s=1' -> the settings the chosen config there does have."""
    from omegaconf import OmegaConf

    parent = key.rpartition(".")[0]
    others = [o for o in overrides if not o.lstrip("+~").startswith(f"{parent}." if parent else f"{key}=")]
    try:
        cfg = compose(others, config_dir)
        node = OmegaConf.select(cfg, parent) if parent else cfg
        settings = settings_of(node)
    except Exception:
        return f"{key} is not a setting of the chosen {parent or 'run'}"
    where = f"{parent}={node.name}" if parent and "name" in node else parent or "the run"
    return f"{where} has no setting {key} (its settings: {', '.join(settings) or 'none'}){nearest_hint(key, settings)}"


def composition_message(error: Exception, overrides: list[str], config_dir: Path) -> str:
    """'Error merging override dtype=float8' + its cause -> one line naming both."""
    head = first_line(error)
    unknown = re.match(r"Could not override '([^']+)'", head)
    if unknown:
        return _unknown_setting(unknown.group(1), overrides, config_dir)
    cause = error.__cause__ or error.__context__
    if cause is not None and first_line(cause) not in head:
        head = f"{head.removeprefix('Error merging override ').rstrip('.')}: {first_line(cause)}"
    return head

"""What a run needs of where it runs, checked before Hydra composes it (runner.launch.preflight): the launcher's
plugin installed, the launcher's own settings typed, and the thread variables of the environment counts. Each check
returns the one line that refuses the run, or None."""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping

from runner.identity import SPEED_VARIABLES
from runner.launch.cluster_jobs import blocks_error

LAUNCHER_EXTRAS = {"ray_cluster": ("hydra_plugins.hydra_ray_launcher", "ray")}  # launcher -> (its plugin, extra)


def problem(parsed: list, environ: Mapping[str, str]) -> str | None:
    """The first thing wrong with the launcher the overrides `parsed` choose or the environment, in one line."""
    return launcher_missing(parsed) or launcher_setting(parsed) or thread_variable(environ)


def launcher_missing(parsed: list) -> str | None:
    """A launcher whose plugin comes with an extra that is not installed."""
    for override in parsed:
        if override.key_or_group == "hydra/launcher" and override.value() in LAUNCHER_EXTRAS:
            name = override.value()
            plugin, extra = LAUNCHER_EXTRAS[name]
            if importlib.util.find_spec(plugin) is None:
                return f"hydra/launcher={name} needs the {extra} extra: pip install -e '.[{extra}]'"
    return None


def launcher_setting(parsed: list) -> str | None:
    """The launcher settings this project adds, typed as their launchers take them: hydra.launcher.blocks."""
    for override in parsed:
        if override.key_or_group == "hydra.launcher.blocks" and (line := blocks_error(override.value())):
            return line
    return None


def thread_variable(environ: Mapping[str, str]) -> str | None:
    """A thread count in the environment that is no count (OMP_NUM_THREADS=abc) would run with the library's default
    and be recorded as another kind of machine. OpenMP's nested form (4,2) is a count."""
    for name in (k for k in SPEED_VARIABLES if k.endswith("_THREADS")):
        value = environ.get(name, "")
        if value and not all(part.strip().isdigit() and int(part) >= 1 for part in value.split(",")):
            return f"{name}={value}: a number of threads, 1 or more (OpenMP's nested form: 4,2), or unset"
    return None

"""What a run needs of where it runs, checked before Hydra composes it (runner.launch.preflight): the launcher's
plugin installed, the launcher's own settings typed, the thread variables of the environment counts, and the output
folder can be made and written. Each check returns the one line that refuses the run, or None."""

from __future__ import annotations

import importlib.util
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path

from runner.identity import SPEED_VARIABLES
from runner.launch.cluster_jobs import blocks_error

LEAST_FREE = 2**20  # bytes free where a run writes: Hydra's files, the log, result.json (a full device: one line)
LAUNCHER_EXTRAS = {"ray_cluster": ("hydra_plugins.hydra_ray_launcher", "ray")}  # launcher -> (its plugin, extra)


def problem(parsed: list, environ: Mapping[str, str]) -> str | None:
    """The first thing wrong with the launcher the overrides `parsed` choose or the environment, in one line."""
    return launcher_missing(parsed) or launcher_setting(parsed) or cluster_nodes(parsed) or thread_variable(environ)


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


def cluster_nodes(parsed: list) -> str | None:
    """hydra.launcher.blocks=N on SLURM, given on the command line: N nodes of the partition take jobs now (sinfo),
    refused before anything is written or submitted where fewer do (runner.launch.slurm_fit.blocks_refusal; the
    launcher checks again, for a blocks set in a yaml)."""
    given = {o.key_or_group: o.value() for o in parsed if not o.is_sweep_override()}
    blocks = given.get("hydra.launcher.blocks")
    if given.get("hydra/launcher") != "slurm" or not isinstance(blocks, int) or blocks_error(blocks):
        return None
    from runner.launch.slurm_fit import blocks_on_partition

    partition = given.get("hydra.launcher.partition")
    return blocks_on_partition(blocks, None if partition is None else str(partition))


def thread_variable(environ: Mapping[str, str]) -> str | None:
    """A thread count in the environment that is no count (OMP_NUM_THREADS=abc) would run with the library's default
    and be recorded as another kind of machine. OpenMP's nested form (4,2) is a count."""
    for name in (k for k in SPEED_VARIABLES if k.endswith("_THREADS")):
        value = environ.get(name, "")
        if value and not all(part.strip().isdigit() and int(part) >= 1 for part in value.split(",")):
            return f"{name}={value}: a number of threads, 1 or more (OpenMP's nested form: 4,2), or unset"
    return None


def folder_problem(key: str, folder: str) -> str | None:
    """Why the folder cannot be created (or is there) and written, in one line: a read-only place, a name longer than
    the file system takes, a file on the way. Probed, as access() says yes to root on a read-only file system."""
    if not folder.strip():  # Hydra would write the run in the folder the command runs in
        return f"{key} is empty: name a folder to write in, or leave it out for the default one"
    path = Path(folder).absolute()
    existing, reached = Path(path.anchor), True  # the nearest folder that exists; whether every one above it does
    for part in path.parts[1:]:
        limit = _longest_name(existing)
        if len(os.fsencode(part)) > limit:
            return (
                f"{key}={folder}: the name {part[:12]}... is {len(os.fsencode(part))} bytes long, and "
                f"{existing} takes names of at most {limit}"
            )
        reached = reached and (existing / part).exists()
        existing = existing / part if reached else existing
    if not existing.is_dir():
        return f"{key}={folder}: {existing} is a file, not a folder"
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".runner-probe-", dir=existing))
        free = os.statvfs(existing).f_bavail * os.statvfs(existing).f_frsize
    except OSError as error:
        return f"{key}={folder}: cannot create folders in {existing} ({error.strerror})"
    if free < LEAST_FREE:
        return f"{key}={folder}: {existing} has {free // 1024} KiB free, a run's record needs at least 1024 KiB"
    return None


def _longest_name(folder: Path) -> int:
    """The longest name, in bytes, the file system of an existing folder takes (255 on most)."""
    try:
        return os.pathconf(folder, "PC_NAME_MAX")
    except (OSError, ValueError):
        return 255

"""Validate command-line overrides before Hydra starts, so bad input costs one clear line.

Hydra's own composition errors span many lines; here each override (each value of a sweep) is
composed once against the structured configs and the first failure is reported as one line.
"""

from __future__ import annotations

import sys
from pathlib import Path

from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import MissingConfigException

from runner.config import PROJECT_ROOT

CONFIG_DIR = PROJECT_ROOT / "conf"
MULTIRUN_FLAGS = ("-m", "--multirun")


class BadInput(ValueError):
    """One-line description of a bad override."""


def check_argv(argv: list[str], config_dir: Path = CONFIG_DIR) -> None:
    """Raise BadInput for the first override that cannot compose. Other Hydra flags are left alone."""
    if any(arg.startswith("-") and arg not in MULTIRUN_FLAGS for arg in argv):
        return  # --help, --cfg, -c job ... : Hydra's own business
    overrides = [arg for arg in argv if arg not in MULTIRUN_FLAGS]
    try:
        parsed = OverridesParser.create().parse_overrides(overrides)
    except Exception as error:
        raise BadInput(f"cannot parse overrides: {_first_line(error)}") from None
    base = [o.input_line for o in parsed if not _is_hydra(o.key_or_group)]
    for _index, override in enumerate(parsed):
        if _is_hydra(override.key_or_group) or not override.is_sweep_override():
            continue
        for value in override.sweep_string_iterator():
            variant = list(base)
            variant[base.index(override.input_line)] = f"{_prefix(override)}{override.key_or_group}={value}"
            _compose(_singles(variant, parsed), config_dir)
    _compose(_singles(base, parsed), config_dir)


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


def _compose(overrides: list[str], config_dir: Path) -> None:
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(config_dir), version_base="1.3"):
            compose(config_name="config", overrides=overrides)
    except MissingConfigException as error:
        raise BadInput(_missing_option(error, overrides)) from None
    except Exception as error:
        raise BadInput(_composition_message(error)) from None
    finally:
        GlobalHydra.instance().clear()


def _missing_option(error: MissingConfigException, overrides: list[str]) -> str:
    missing = (error.missing_cfg_file or "").removesuffix(".yaml")
    group, _, value = missing.rpartition("/")
    options = ", ".join(sorted(error.options or []))
    if group:
        return f"{group}={value} is not an option (allowed {group}: {options})"
    return _first_line(error)


def _composition_message(error: Exception) -> str:
    """'Error merging override dtype=float8' + its cause -> one line naming both."""
    head = _first_line(error)
    cause = error.__cause__ or error.__context__
    if cause is not None and _first_line(cause) not in head:
        head = f"{head.removeprefix('Error merging override ').rstrip('.')}: {_first_line(cause)}"
    return head


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0].strip() if text else type(error).__name__


def main(argv: list[str] | None = None) -> None:
    """Exit with status 2 and one line on stderr when the overrides cannot compose."""
    try:
        check_argv(sys.argv[1:] if argv is None else argv)
    except BadInput as error:
        print(f"error: {error}", file=sys.stderr)
        raise SystemExit(2) from None

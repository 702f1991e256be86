"""Where tensor-runner finds its configs and writes its outputs: a source checkout or an installed wheel.

From a source checkout (run.py and conf/ beside src/; an editable install too) the configs are the checkout's
conf/ and outputs/ is the checkout's own. An installed wheel reads the configs it ships, the package
tensor_runner_conf (pyproject.toml maps it to conf/), and writes under ./outputs of the current directory.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parents[2]  # the repository's root, when running from a source checkout
FROM_CHECKOUT = (PROJECT_ROOT / "run.py").is_file() and (PROJECT_ROOT / "conf" / "config.yaml").is_file()
CONFIG_PACKAGE = "tensor_runner_conf"


def packaged_config_dir() -> Path:
    """The folder of the configs the installed wheel ships, found without importing their package."""
    spec = importlib.util.find_spec(CONFIG_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(f"tensor-runner's configs are not installed (no package {CONFIG_PACKAGE})")
    return Path(next(iter(spec.submodule_search_locations)))


CONFIG_DIR = PROJECT_ROOT / "conf" if FROM_CHECKOUT else packaged_config_dir()
# Hydra's config_path for the app (runner.app): the same files as CONFIG_DIR, as a package's where installed.
CONFIG_PATH = str(CONFIG_DIR) if FROM_CHECKOUT else f"pkg://{CONFIG_PACKAGE}"


def output_root() -> Path:
    """The folder holding outputs/ (runs, sweeps, the default MLflow store): what `${runner.root:}` resolves to."""
    return PROJECT_ROOT if FROM_CHECKOUT else Path.cwd()

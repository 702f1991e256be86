"""Start a process from another environment's interpreter (environment.*): multiprocessing's spawn, told which.

A spawned child runs multiprocessing's own bootstrap, which takes the parent's module path and main module; a
worker of another environment must have that environment's instead, or it would import the runner's own torch.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator

from runner.locations import FROM_CHECKOUT, PROJECT_ROOT
from runner.spec import PythonEnvironment

_SPAWNING = threading.Lock()  # the executable is multiprocessing's global: one spawn at a time changes it


# the checkout's folder holding the runner that launches the job; an installed runner is in its environment's packages
SOURCE = [str(PROJECT_ROOT / "src")] if FROM_CHECKOUT else []


def module_path(environment: PythonEnvironment) -> list[str]:
    """The module path of the environment's processes: PYTHONPATH's folders first, as Python puts them, then a
    checkout's source (a job runs the code of the checkout that launched it, whoever built the environment), then its
    interpreter's own path."""
    extra = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    return list(dict.fromkeys([*extra, *SOURCE, *environment.sys_path]))


@contextlib.contextmanager
def spawning_from(environment: PythonEnvironment | None) -> Iterator[None]:
    """Processes spawned meanwhile start from `environment`'s interpreter with its module path and no main module
    (the worker's target is the runner's, which its path holds); nothing changes for None, the runner's own."""
    if environment is None:
        yield
        return
    from multiprocessing import spawn

    with _SPAWNING:
        executable, preparation = spawn.get_executable(), spawn.get_preparation_data

        def prepared(name: str) -> dict:
            data = preparation(name)
            data["sys_path"] = module_path(environment)
            data.pop("init_main_from_path", None)
            data.pop("init_main_from_name", None)
            return data

        spawn.set_executable(environment.python)
        spawn.get_preparation_data = prepared
        try:
            yield
        finally:
            spawn.set_executable(executable)
            spawn.get_preparation_data = preparation

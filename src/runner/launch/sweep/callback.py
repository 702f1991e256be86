"""A sweep's two ends around its launch, whatever launcher runs the jobs.

Hydra calls `SweepCallback` (listed under `hydra.callbacks` in conf/config.yaml) in the launching process:
`on_multirun_start` opens the sweep (runner.launch.sweep.lifecycle.start), `on_multirun_end` closes it (`finish`)
and exits with the sweep's code. Hydra skips `on_multirun_end` when the launch is stopped (Ctrl-C, SIGTERM, a
launcher's refusal unwind through Hydra), so the app runs Hydra inside `closed_when_stopped`, which closes the
sweep whose launch was stopped. A launcher does nothing for this: the runner's, Hydra's own and one added from
outside close their sweep alike, with nothing to remember.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from runner.launch import launchers
from runner.launch.sweep import lifecycle
from runner.measure.stop import stop_reason

# The sweep this process is launching: from the end of on_multirun_start to the start of on_multirun_end.
_launching: list[Path] = []


class SweepCallback(Callback):
    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        lifecycle.start(config)
        _launching[:] = [Path(str(config.hydra.sweep.dir))]

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        _launching.clear()  # the launch is over: from here on, `finish` below closes the sweep
        code = lifecycle.finish(Path(str(config.hydra.sweep.dir)))
        if code:
            raise SystemExit(code)


@contextmanager
def closed_when_stopped() -> Iterator[None]:
    """Around Hydra: where a sweep's launch is stopped (Ctrl-C, SIGTERM) or refused (`launchers.SweepRefused`),
    close the sweep before the stop goes on; a refusal exits 1, its reason in sweep.json and on the parent run."""
    try:
        yield
    except KeyboardInterrupt as stop:
        if _launching:
            lifecycle.finish(_launching.pop(), interrupted=stop_reason(stop))
        raise
    except launchers.SweepRefused as refused:
        if _launching:
            sweep_dir = _launching.pop()
            lifecycle.record_launch_error(sweep_dir, refused.line)
            lifecycle.finish(sweep_dir)
        raise SystemExit(1) from None

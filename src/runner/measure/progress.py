"""A job's progress on stderr while it is set up and timed."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from runner.record.table import format_seconds

if TYPE_CHECKING:
    from rich.status import Status

SAMPLING = "sampling"  # the phase with its own line (runner.measure.timing names its phases)


class ProgressLine:
    """What a job is doing, on stderr: its phase (import, build, first call, warm-up) once that phase has
    lasted `after_s`, then the sampling with its spread and an upper bound on the time left.

    On a terminal it is one `rich` status line that updates in place; elsewhere (a worker's pipe into
    job.log, a CI log) plain lines, so it shows through the worker's log forwarding too. Fast jobs print
    nothing."""

    def __init__(self, label: str, max_time_s: float = 5.0, after_s: float = 1.0, every_s: float = 1.0):
        from rich.console import Console

        self.label, self.max_time_s, self.after_s, self.every_s = label, max_time_s, after_s, every_s
        self.console = Console(stderr=True, highlight=False)
        self.tty = self.console.is_terminal
        self.status: Status | None = None
        self.last_print = float("-inf")  # the first line comes at after_s, later ones every every_s
        self.timer: threading.Timer | None = None

    def __enter__(self) -> ProgressLine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def phase(self, name: str) -> None:
        """A new phase starts; it is shown if it is still running `after_s` from now (sampling has its own line)."""
        self._cancel_timer()
        if name == SAMPLING:
            return
        started = time.perf_counter()
        self.timer = threading.Timer(self.after_s, self._show, args=(name, started))
        self.timer.daemon = True
        self.timer.start()

    def _show(self, name: str, started: float) -> None:
        self._say(f"{self.label}: {name} ({time.perf_counter() - started:.0f} s so far)")

    def __call__(self, samples_s: Sequence[float], elapsed: float) -> None:
        """Called after each timing sample, with the samples so far (seconds per call)."""
        every = self.every_s if self.tty else 5 * self.every_s
        if elapsed < self.after_s or elapsed - self.last_print < every:
            return
        self._cancel_timer()
        self.last_print = elapsed
        q25, median, q75 = np.percentile(samples_s, [25, 50, 75])
        left = max(self.max_time_s - elapsed, 0.0)
        self._say(
            f"timing {self.label}: {len(samples_s)} samples in {elapsed:.1f} s, median {format_seconds(median)}, "
            f"IQR/median {(q75 - q25) / median:.1%}, at most {left:.0f} s left"
        )

    def _say(self, text: str) -> None:
        if not self.tty:
            self.console.print(f"  {text}", soft_wrap=True)
        elif self.status is None:
            self.status = self.console.status(text)
            self.status.start()
        else:
            self.status.update(text)

    def _cancel_timer(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def close(self) -> None:
        self._cancel_timer()
        if self.status is not None:
            self.status.stop()
            self.status = None

"""What stopped a job from outside it (Ctrl-C, SIGTERM), as a value: the record says it, the launcher sends its
signal to a worker, and `Stopped` unwinds the job with it."""

from __future__ import annotations

import signal
from enum import StrEnum


class StopReason(StrEnum):
    """What stopped a job from outside it, as its record says it; `signal` is the one that stops a worker."""

    CTRL_C = "interrupted by the user (Ctrl-C)"
    SIGTERM = "terminated (SIGTERM)"  # scancel, kill, a closing session

    @property
    def signal(self) -> signal.Signals:
        return signal.SIGINT if self is StopReason.CTRL_C else signal.SIGTERM


CTRL_C, SIGTERM = StopReason.CTRL_C, StopReason.SIGTERM


class Stopped(KeyboardInterrupt):
    """A stop whose reason is known (SIGTERM from scancel, kill or a closing session; a stopped sweep): it
    unwinds like Ctrl-C and carries the reason."""

    def __init__(self, reason: StopReason | str):
        super().__init__(reason)
        self.reason = StopReason(reason)


def stop_reason(interrupt: BaseException | None) -> StopReason:
    """What stopped a job: the reason a `Stopped` carries (also as the cause of another exception); a bare
    KeyboardInterrupt is Ctrl-C."""
    while interrupt is not None:
        if isinstance(interrupt, Stopped):
            return interrupt.reason
        interrupt = interrupt.__cause__ or interrupt.__context__
    return CTRL_C

"""What the launcher says over its pipes, one type per message: to a job's worker (MayTime ... Finished, Dismissed), and
to its backend's fork server (Fork, Forked, Ended)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class MayTime:
    """Launcher -> worker: the MLflow store is open, timing may begin."""


@dataclass(frozen=True)
class Ready:
    """Worker -> launcher: set up and warm, waiting for its turns in the interleaved rounds."""

    first_call_s: float
    block_size: int  # calls per sample
    rounds: int  # the turns it takes
    processes: int = 1  # the worker processes the job's budget pays for (timing.processes, or fewer)


@dataclass(frozen=True)
class Turn:
    """Launcher -> worker: sample now, in this round."""

    round: int


@dataclass(frozen=True)
class TurnDone:
    """Worker -> launcher: the samples of its turn (runner.measure.samples.Samples.since: column by column)."""

    samples: dict[str, list]


@dataclass(frozen=True)
class Finished:
    """Launcher -> worker: the rounds are over; record the job, with the samples of all its processes where it
    has several (Samples.columns; None: its own)."""

    samples: dict[str, list] | None = None


@dataclass(frozen=True)
class Dismissed:
    """Launcher -> one of a job's other processes (timing.processes): the rounds are over; exit, recording nothing."""


@dataclass(frozen=True)
class Load:
    """Launcher -> a spare fork server (started before the config was composed): import this backend module, the
    one its workers will run, then what every job imports; its first message."""

    module: str


@dataclass(frozen=True)
class Fork:
    """Launcher -> fork server: fork a worker running the worker main with these arguments, in the launcher's
    environment, path and directory (`context`); the job's pipe follows as a handle."""

    target_args: tuple
    context: dict


@dataclass(frozen=True)
class Forked:
    """Fork server -> launcher: the worker it forked."""

    pid: int


@dataclass(frozen=True)
class Ended:
    """Fork server -> launcher: a worker ended, with this exit code (negative: killed by that signal)."""

    pid: int
    exitcode: int

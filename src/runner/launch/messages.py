"""What the launcher and a job's worker say to each other over the job's pipe: one type per message."""

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
    """Launcher -> worker: the rounds are over; record the job."""

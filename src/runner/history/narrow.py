"""`runner history --series NAMES`: every series a history fits, each by one name, and the histories narrowed to the
series named: the typical time, the numbers against float64 (series.NUMBERS) and the figures a CI job gates on
(figures.FIGURES). A name is the metric's own (`first_call_s`, as result.json and --json name it) or what a line says
of it (`first call`); the gate (--fail-on) then fails only on steps of the series named, and every output shows only
them. Without --series, every series is read and gated."""

from __future__ import annotations

from dataclasses import replace

from runner.history.figures import FIGURES
from runner.history.series import NUMBERS, History

TIMES = "time_typical_s"  # the series of the typical time, a run's headline


def series_names() -> dict[str, str]:
    """Every series a history may fit, by its metric's name, with what a line calls it."""
    return {TIMES: "typical time", **NUMBERS, **{name: figure.said for name, figure in FIGURES.items()}}


def chosen(text: str | None) -> frozenset[str] | None:
    """The series `--series NAMES` names ('first_call_s,time_typical_s', or 'first call'), by their metric's names;
    None where the option is not given (every series). An unknown name is refused in one line naming the allowed."""
    if text is None:
        return None
    names = series_names()
    by_said = {said: name for name, said in names.items()}
    given = [part.strip() for part in text.split(",") if part.strip()]
    unknown = [part for part in given if part not in names and part not in by_said]
    if unknown or not given:
        what = f"{', '.join(unknown)} {'is' if len(unknown) == 1 else 'are'} no series" if unknown else "no name given"
        raise LookupError(f"--series {text}: {what} (allowed: {', '.join(names)})")
    return frozenset(by_said.get(part, part) for part in given)


def narrowed(histories: list[History], names: frozenset[str] | None) -> list[History]:
    """The histories with only the steps of the series `names` holds (None: as they are): the times' (and the raw
    times' beside a control) where it holds TIMES, and those of its numbers and figures. Each history keeps its runs,
    and says which series it was narrowed to (History.series)."""
    if names is None:
        return histories
    return [
        replace(
            h,
            steps=h.steps if TIMES in names else [],
            raw_steps=h.raw_steps if TIMES in names else [],
            numbers={name: steps for name, steps in h.numbers.items() if name in names},
            figures={name: steps for name, steps in h.figures.items() if name in names},
            series=names,
        )
        for h in histories
    ]


def times_read(history: History) -> bool:
    """Whether the history's series of typical times is read (no --series, or one naming it)."""
    return history.series is None or TIMES in history.series

"""One case's series on one machine, as `runner history` holds it: each run an Entry (its typical time, its control's,
its numbers), the History of them with the steps found (runner.history.build builds it)."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from runner.history.steps import Point, Step
from runner.identity import several_hosts
from runner.report import statistics
from runner.report.ratio import APART_SD, PROCESS_SD
from runner.report.statistics import LEVEL, student_quantile

# The numbers a run records against its float64 reference, fitted as its times are, and how a line names them.
NUMBERS = {
    "max_rel_err_vs_reference": "max rel err vs float64",
    "tokens_differ": "tokens differing from float64's",
}
EXACT = float(np.finfo(np.float64).eps)  # an error below float64's own rounding is not told apart from none


def apart_interval(typical_s: float, processes: int = 1, level: float = LEVEL) -> tuple[float, float]:
    """A run's typical time as one point of a history (runner.history.build): the interval runs made apart get
    around it. Two such runs compare as `compare(..., apart=True)` has them, the machine's drift between them
    (APART_SD, half its variance to each) and each one's processes' own offsets (PROCESS_SD, averaged over them)."""
    sd = math.sqrt(APART_SD**2 / 2 + PROCESS_SD**2 / processes)
    half = student_quantile(math.inf, (1 + level) / 2) * sd
    return typical_s * math.exp(-half), typical_s * math.exp(half)


def relative_interval(ratio: float, processes: int = 1, level: float = LEVEL) -> tuple[float, float]:
    """A run's time over its control's, measured in the same rounds, as one point of a history: the machine's drift
    between sweeps cancels in it; the offsets of their processes stay (PROCESS_SD; the run's averaged over its own)."""
    sd = PROCESS_SD * math.sqrt(1 / processes + 1)
    half = student_quantile(math.inf, (1 + level) / 2) * sd
    return ratio * math.exp(-half), ratio * math.exp(half)


@dataclass(frozen=True)
class Entry:
    """One run of a case's series."""

    run_id: str  # its MLflow run id, or its directory where it was read from one
    started: float  # epoch seconds
    typical_s: float
    processes: int = 1
    change: str = ""  # why the distribution changes here, where a curator marked it
    version: str = ""  # what it ran with: the framework's version and the runner's commit
    control_s: float = math.nan  # the typical time of the control its sweep timed beside it (runner.launch.control)
    numbers: dict[str, float] = field(default_factory=dict)  # its NUMBERS, where it recorded them
    confirmed: str = ""  # its CONFIRMED_TAG, where runner history --confirm re-ran its case
    busy: float = 0.0  # other runnable threads while it was timed, on average (machine_other_runnable)
    sweep: str = ""  # the sweep it was measured in (its MLflow parent run or folder): its replicates there, one point
    experiment_id: str = ""  # its MLflow experiment ('' read from a folder): its page's link names it
    figures: dict[str, float] = field(default_factory=dict)  # its other figures (figures.FIGURES) recorded
    host: str = ""  # where it ran ('' not known): a pool's runs of one kind of machine are one series
    control_lost: str = ""  # where its sweep named a control that gave no time, why (build.control_lost)

    def point(self, relative: bool = False) -> Point:
        """Its typical time as a run of the series, or its ratio to its control (`relative`): measured in the same
        rounds, the machine's drift between sweeps cancels in it and only the two processes' offsets are left (NaN,
        which the detector leaves out, where its control gave no time). The runs of one sweep are replicates (seeds,
        hosts of one kind): the detector takes them as one point."""
        if relative:
            value = self.typical_s / self.control_s
            low, high = relative_interval(value, self.processes)
        else:
            value = self.typical_s
            low, high = apart_interval(value, self.processes)
        return Point(value, low, high, known_change=bool(self.change), group=self.sweep)

    def number_point(self, name: str) -> Point:
        """One of its NUMBERS as a point to fit on the log scale, with no interval (the fit measures the series'
        noise): an exact result as EXACT, a count of tokens plus one (none differing: 1); NaN where it has none."""
        value = self.numbers.get(name, math.nan)
        shown = value + 1 if name == "tokens_differ" else max(value, EXACT)
        return Point(shown, math.nan, math.nan, known_change=bool(self.change), group=self.sweep)


@dataclass
class History:
    """A case on one machine: its runs in time order and the steps found in them."""

    case: str
    case_name: str
    machine: str
    machine_name: str
    entries: list[Entry] = field(default_factory=list)
    steps: list[Step] = field(default_factory=list)
    control_name: str = ""  # the control the steps were found relative to ('' : fitted on the times themselves)
    is_control: bool = False  # the control of other series: its steps are the machine's, no gate fails on them
    raw_steps: list[Step] = field(default_factory=list)  # where relative: the steps of the times themselves
    numbers: dict[str, list[Step]] = field(default_factory=dict)  # per metric of NUMBERS it has: its NUMERIC steps
    figures: dict[str, list[Step]] = field(default_factory=dict)  # per figure of figures.FIGURES: its steps
    series: frozenset[str] | None = None  # the series read (runner history --series, history.narrow); None: every one

    @property
    def relative(self) -> bool:
        return bool(self.control_name)

    def newest_step(self) -> Step | None:
        return max(self.steps, key=lambda s: s.index, default=None)

    def several_hosts(self) -> bool:
        """Whether its runs ran on more than one host (runner.identity.several_hosts): then each run's is shown."""
        return several_hosts(e.host for e in self.entries)


def either_side(entries: list[Entry], steps: list[Step], step: Step) -> tuple[list[Entry], list[Entry]]:
    """The runs of the level before `step` and of the level after it, among a series' `steps`: each from the step
    before (or the first run) to the next one (or the newest run), as runner.report.statistics.either_side spans."""
    before, after = statistics.either_side([s.index for s in steps], step.index, len(entries))
    return entries[before], entries[after]


def medians_either_side(
    entries: list[Entry], steps: list[Step], step: Step, value: Callable[[Entry], float]
) -> tuple[float, float]:
    """The median of a run's `value` (NaN where it has none) over the runs of the level before `step` and of the
    level after it (either_side); NaN where a level has no value."""

    def median(side: list[Entry]) -> float:
        values = [v for v in map(value, side) if not math.isnan(v)]
        return float(np.median(values)) if values else math.nan

    before, after = either_side(entries, steps, step)
    return median(before), median(after)

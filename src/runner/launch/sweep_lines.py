"""What a sweep says while it runs, kept short: one line per job when it ends, a progress line every few
seconds with the time left, and each warning once under the table with the jobs it concerns.

Everything goes through `logging` (module loggers under `runner.launch`), so Hydra's logging config
decides where it lands: `hydra/job_logging` for what a job says (its line, also in the job's `.log`),
`hydra/hydra_logging` for what the launching process says, `hydra.verbose=runner` for the debug lines.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Iterable
from pathlib import Path

from runner.record.result import Result, Status

PROGRESS_EVERY_S = 5.0  # at most one progress line this often
NUMBER = re.compile(r"\d+(?:\.\d+)?")


def in_sweep() -> bool:
    """Whether this process runs a multirun (Hydra's mode), where a job's output is kept to one line."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    if not HydraConfig.initialized():
        return False
    return HydraConfig.get().mode == RunMode.MULTIRUN


def job_line(run_dir: Path, result: Result) -> str:
    """'[3/16] numpy-mlp-gradients-eager-cpu-float32 seed=2 #2: FINISHED, median 18.2 µs, 2 warnings'."""
    from runner.record.naming import job_context, run_name
    from runner.record.sweep_file import read_sweep_file
    from runner.record.table import format_seconds

    swept, number = job_context(Path(run_dir))
    name = run_name(result.config, swept, number or Path(run_dir).name) if result.config else Path(run_dir).name
    launched = read_sweep_file(Path(run_dir).parent).get("jobs_launched")  # where the launcher says (RoundsLauncher)
    head = f"[{int(number) + 1}/{launched}] " if number and number.isdigit() and launched else ""
    if result.status == Status.FINISHED:
        tail = f"FINISHED, median {format_seconds(result.metrics.get('time_median_s', float('nan')))}"
    else:
        tail = f"{result.status}: {result.error or 'no reason recorded'}"
    count = len(result.warnings)
    notes = f", {count} warning{'s' * (count != 1)} (under the table)" if count else ""
    return f"{head}{name}: {tail}{notes}"


def say_job_line(logger: logging.Logger, run_dir: Path) -> None:
    """The job's line (job_line), from its result.json, said by the process that launched it on another machine (a
    Ray task): INFO where it finished, else WARNING, as a job says it itself (runner.launch.job_return). Nothing
    where run_dir holds no result (a sweep folder the nodes do not share: the table says so)."""
    if not Result.exists(run_dir):
        return
    result = Result.load(run_dir)
    logger.log(logging.INFO if result.status == Status.FINISHED else logging.WARNING, job_line(run_dir, result))


def grouped_warnings(job_warnings: Iterable[tuple[str, list[str]]]) -> list[str]:
    """Each warning once, with the jobs it concerns: warnings that differ only in their numbers are one,
    each number shown as the range the jobs gave ('2.1-2.3 other runnable threads ... (jobs 0-15)')."""
    groups: dict[tuple[str, ...], list[tuple[str, list[float], str]]] = {}
    for job, warnings in job_warnings:
        for warning in warnings:
            words = tuple(NUMBER.split(warning))
            groups.setdefault(words, []).append((job, [float(n) for n in NUMBER.findall(warning)], warning))
    lines = []
    for words, seen in groups.items():
        numbers = zip(*(values for _, values, _ in seen), strict=True)
        texts = [_number_range(column, seen, i) for i, column in enumerate(numbers)]
        text = "".join(w + (texts[i] if i < len(texts) else "") for i, w in enumerate(words))
        lines.append(f"{text} ({jobs_text([job for job, _, _ in seen])})")
    return lines


def _number_range(column: tuple[float, ...], seen: list, index: int) -> str:
    """The numbers at one place of a warning, as its jobs wrote them: one value, or 'low-high'."""
    written = [NUMBER.findall(warning)[index] for _, _, warning in seen]
    low, high = min(range(len(column)), key=column.__getitem__), max(range(len(column)), key=column.__getitem__)
    return written[low] if column[low] == column[high] else f"{written[low]}-{written[high]}"


def jobs_text(jobs: list[str]) -> str:
    """'job 3', 'jobs 0, 1, 3', 'jobs 0-15': numbered jobs in order, consecutive ones as a range."""
    numbers = sorted({int(j) for j in jobs if j.isdigit()})
    others = sorted({j for j in jobs if not j.isdigit()})
    parts: list[tuple[int, int]] = []  # (first, last) of each run of consecutive jobs
    for n in numbers:
        if parts and parts[-1][1] == n - 1:
            parts[-1] = (parts[-1][0], n)
        else:
            parts.append((n, n))
    named = [str(a) if a == b else f"{a}, {b}" if b == a + 1 else f"{a}-{b}" for a, b in parts] + others
    count = len(numbers) + len(others)
    return f"job{'s' * (count != 1)} {', '.join(named)}"


class Every:
    """Says a progress line at most once every `every_s` seconds (the first once `every_s` has passed),
    and the lines it is told to say regardless."""

    def __init__(self, logger: logging.Logger, every_s: float = PROGRESS_EVERY_S):
        self.logger, self.every_s = logger, every_s
        self.start = time.perf_counter()
        self.shown = self.start

    def elapsed(self) -> float:
        return time.perf_counter() - self.start

    def say(self, text: str, always: bool = False) -> bool:
        now = time.perf_counter()
        if not always and now - self.shown < self.every_s:
            return False
        self.shown = now
        self.logger.info(text)
        return True


def time_left(elapsed_s: float, done: int, total: int) -> str:
    """'about 12 s left', from the pace of the `done` of `total` steps so far."""
    if done <= 0 or done >= total:
        return ""
    left = elapsed_s / done * (total - done)
    return f", about {left:.0f} s left" if left >= 1 else ", under a second left"


class PlainFormatter(logging.Formatter):
    """The message alone, after 'warning: ' or 'error: ' where it is one: what conf/hydra/job_logging/runner.yaml
    and conf/hydra/hydra_logging/runner.yaml show on the terminal."""

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        if record.levelno >= logging.ERROR:
            return f"error: {text}"
        return f"warning: {text}" if record.levelno >= logging.WARNING else text

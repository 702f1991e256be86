"""A job's log (job.log) as the launcher shows it: the worker's output copied to the terminal while it
runs, the frameworks' start-up chatter left in the file. In a sweep the worker's lines are debug messages
of this module's logger (`hydra.verbose=runner.launch.job_log` shows them): the sweep says one line per job,
and job.log keeps everything."""

from __future__ import annotations

import logging
import re
import sys
import threading
from pathlib import Path

log = logging.getLogger(__name__)


class LogForwarder:
    """Copies what the worker writes to job.log onto this process's stderr while it runs; with `quiet` (a
    sweep's job) into this module's logger at debug level instead."""

    def __init__(self, path: Path, every_s: float = 0.1, quiet: bool = False):
        self.path, self.every_s, self.quiet = path, every_s, quiet
        self.done = threading.Event()
        self.pending = ""  # a line the worker has not finished writing
        self.thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self.done.set()
        self.thread.join()

    def _run(self) -> None:
        with self.path.open("rb") as f:
            while not self.done.wait(self.every_s):
                self._copy(f)
            self._copy(f)

    def _copy(self, f) -> None:
        self.pending += f.read().decode(errors="replace")
        lines = self.pending.splitlines(keepends=True)
        self.pending = lines.pop() if lines and not lines[-1].endswith("\n") else ""
        shown = [line for line in lines if not is_framework_noise(line)]
        if self.done.is_set() and self.pending:  # the worker ended without a newline
            shown.append(self.pending + "\n")
            self.pending = ""
        if shown and self.quiet:
            for line in shown:
                log.debug(f"{self.path.parent.name}: {line.rstrip()}")
        elif shown:
            sys.stderr.write("".join(shown))
            sys.stderr.flush()


# Start-up chatter of the frameworks' C++ runtimes (absl/TF logging): it stays in job.log, unechoed.
FRAMEWORK_NOISE = re.compile(
    r"^(?:[IW]\d{4} \d\d:\d\d:\d+\.\d+\s+\d+ \S+:\d+\]"  # absl INFO/WARNING lines
    r"|E\d{4} \d\d:\d\d:\d+\.\d+\s+\d+ cuda_\w+\.cc:\d+\]"  # "failed call to cuInit" on a machine without GPU
    r"|\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+: [IW] "  # TF's older C++ log format
    r"|WARNING: All log messages before absl::InitializeLog\(\) is called"
    r"|To enable the following instructions: .* rebuild TensorFlow)"
)


def is_framework_noise(line: str) -> bool:
    return bool(FRAMEWORK_NOISE.match(line))

"""A workload whose process dies as it is built (SIGKILL, as the out-of-memory killer sends): for tests of
what a launcher does with a job that never returns."""

from __future__ import annotations

import os
import signal

from runner.models import Workload


class CrashModel(Workload):
    builds_without_framework = False  # preflight builds no such workload: it dies in the process that builds it

    def __init__(self):
        os.kill(os.getpid(), signal.SIGKILL)

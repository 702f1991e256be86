"""Imported by a fork server as its backend (tests/test_single_run.py): writes which of the job's modules the server
had imported before it, to the file IMPORT_ORDER_PROBE names."""

import os
import sys

from runner.launch.fork_server import JOB_MODULES

with open(os.environ["IMPORT_ORDER_PROBE"], "w") as probe:
    probe.write(" ".join(name for name in JOB_MODULES if name in sys.modules))

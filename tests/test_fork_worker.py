"""The launcher's handle on a forked worker answers as multiprocessing's Process does (runner.launch.fork_server)."""

from __future__ import annotations

import os
from multiprocessing.connection import wait

import pytest

from runner.launch.fork_server import ForkedWorker


def test_a_forked_workers_sentinel_is_readable_once_it_ended_and_refused_once_closed():
    worker = ForkedWorker(os.getpid())  # no process is forked: the server's report of its end is played here
    assert worker.is_alive() and wait([worker.sentinel], timeout=0) == []
    with pytest.raises(ValueError):  # still running: close refuses, as Process.close does
        worker.close()
    worker.ended(3)
    assert not worker.is_alive() and worker.exitcode == 3
    assert wait([worker.sentinel], timeout=0) == [worker.sentinel]
    worker.close()
    with pytest.raises(ValueError):  # closed: no file descriptor that may be another file's by now
        worker.sentinel  # noqa: B018

"""timing.poll_idle: idle CPUs poll while a job is timed (the kernel's PM QoS CPU latency held at 0), recorded in
the environment; where it cannot be held, the job runs as usual and says why."""

from __future__ import annotations

import os
import struct

import pytest
from helpers import compose_config

from runner.launch import isolation
from runner.measure import idle_poll
from runner.measure.timing import Measurement
from runner.record.naming import job_spec

INLINE = ("tracking=none", "isolation=inline")


def test_the_latency_request_is_0_while_inside_and_let_go_after(tmp_path):
    device = tmp_path / "cpu_dma_latency"  # a file stands in: the kernel's device takes the same 4-byte write
    device.write_bytes(b"")
    with idle_poll.polling(True, device) as note:
        assert note == {"cpu_idle_polled": True}
        assert struct.unpack("i", device.read_bytes()) == (0,)
    with idle_poll.polling(False, device) as note:
        assert note == {}


def test_a_request_that_cannot_be_made_says_why(tmp_path):
    with idle_poll.polling(True, tmp_path / "missing") as note:
        assert note["cpu_idle_polled"] is False
        assert note["cpu_idle_poll_unavailable_reason"].endswith("missing: No such file or directory")


def test_a_job_records_whether_the_cpus_polled_and_warns_where_they_could_not(tmp_path, monkeypatch):
    monkeypatch.setattr(idle_poll, "PM_QOS_CPU_LATENCY", tmp_path / "no_such_device")
    result = isolation.execute(job_spec(compose_config("timing.poll_idle=true", *INLINE)), tmp_path / "run")
    assert result.status == "FINISHED"
    assert result.environment["cpu_idle_polled"] is False
    assert any(w.startswith("timing.poll_idle: the CPUs idled as usual (") for w in result.warnings)
    plain = isolation.execute(job_spec(compose_config(*INLINE)), tmp_path / "plain")
    assert "cpu_idle_polled" not in plain.environment and not any("poll_idle" in w for w in plain.warnings)


@pytest.mark.skipif(
    not os.access(idle_poll.PM_QOS_CPU_LATENCY, os.W_OK), reason="the PM QoS device is root's (Linux only)"
)
def test_where_the_machine_allows_it_a_job_holds_the_real_request(tmp_path):
    result = isolation.execute(job_spec(compose_config("timing.poll_idle=true", *INLINE)), tmp_path)
    assert result.status == "FINISHED" and result.environment["cpu_idle_polled"] is True
    assert not any("poll_idle" in w for w in result.warnings)


@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="other cores to wait for: 2 or more")
@pytest.mark.parametrize(
    ("settings", "can_poll", "hint"),
    [
        ([], False, ", or pin it to one core: threads=1"),
        (["threads=1"], False, ""),
        (["threads=1"], True, ", or let idle CPUs poll: timing.poll_idle=true"),
        ([], True, ", or pin it to one core: threads=1, or let idle CPUs poll: timing.poll_idle=true"),
        (["timing.poll_idle=true"], True, ", or pin it to one core: threads=1"),
    ],
)
def test_a_noisy_job_on_cpu_is_told_what_may_steady_it(tmp_path, monkeypatch, settings, can_poll, hint):
    """A call whose work crosses cores waits for each to wake (JAX on CPU): the noisy warning names pinning where
    the user left `threads` unset, and polling where this process could ask for it and has not."""
    device = tmp_path / "cpu_dma_latency"
    if can_poll:
        device.write_bytes(b"")
    monkeypatch.setattr(idle_poll, "PM_QOS_CPU_LATENCY", device)
    monkeypatch.setattr(Measurement, "turn_rel_iqr", lambda self: 0.3)
    result = isolation.execute(job_spec(compose_config(*settings, *INLINE)), tmp_path / "run")
    noisy = next(w for w in result.warnings if w.startswith("noisy measurement"))
    assert noisy.endswith("quiet the machine" + hint)
    if "timing.poll_idle=true" in settings:  # the job itself made the request
        assert device.read_bytes() == struct.pack("i", 0) and result.environment["cpu_idle_polled"] is True

"""timing.poll_idle: while a job is timed, ask Linux to keep idle CPUs polling instead of halting.

A call whose work goes from one thread to another on another core (JAX on CPU hands every call from the Python
thread to XLA's) waits for that core to wake. On a VM a halted CPU wakes through the hypervisor, slower the longer
it slept, and between a sweep's turns it sleeps long: a jitted JAX step's turns spread far more than with the CPUs
polling (BENCHMARKS.md, *Idle CPUs that poll*). The request is
the kernel's PM QoS CPU latency (`/dev/cpu_dma_latency`, 0 µs), held while the file stays open, as tuned's
latency-performance profile holds it; it is root's to make, and idle CPUs then burn power.
"""

from __future__ import annotations

import contextlib
import os
import struct
from collections.abc import Iterator
from pathlib import Path

PM_QOS_CPU_LATENCY = Path("/dev/cpu_dma_latency")


@contextlib.contextmanager
def polling(asked: bool, device: Path | None = None) -> Iterator[dict]:
    """Hold the CPU latency at 0 (at `device`, PM_QOS_CPU_LATENCY unless given) while inside, where `asked`; yields
    what the environment records: {} where not asked, cpu_idle_polled True where held, False and
    cpu_idle_poll_unavailable_reason where it could not be."""
    if not asked:
        yield {}
        return
    device = device or PM_QOS_CPU_LATENCY
    try:
        held = os.open(device, os.O_WRONLY)
    except OSError as error:
        yield _unavailable(device, error)
        return
    try:
        try:
            os.write(held, struct.pack("i", 0))  # a native int, in microseconds
        except OSError as error:
            yield _unavailable(device, error)
        else:
            yield {"cpu_idle_polled": True}
    finally:
        os.close(held)


def _unavailable(device: Path, error: OSError) -> dict:
    return {"cpu_idle_polled": False, "cpu_idle_poll_unavailable_reason": f"{device}: {error.strerror}"}


def waking_hint(threads: int | None, poll_idle: bool) -> str:
    """What a noisy job on CPU may try against waiting for other cores to wake, as the end of its warning: pinning
    where `threads` was left to the framework, polling where this process could make the request."""
    if (os.cpu_count() or 1) < 2:
        return ""
    pin = ", or pin it to one core: threads=1" if threads is None else ""
    can_poll = not poll_idle and os.access(PM_QOS_CPU_LATENCY, os.W_OK)
    poll = ", or let idle CPUs poll: timing.poll_idle=true" if can_poll else ""
    return pin + poll

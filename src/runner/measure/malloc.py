"""Freed memory kept in the process while a job is timed (timing.keep_freed_memory), so that every run times the
steady state, not the page faults of glibc's history-dependent trimming."""

from __future__ import annotations

import ctypes

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameters (malloc.h)
MMAP_THRESHOLD_MAX = 32 * 2**20  # glibc's ceiling for M_MMAP_THRESHOLD on 64-bit machines


def keep_freed_memory() -> bool:
    """Stop glibc from handing freed memory back to the OS between timed calls.

    By default glibc trims the heap as soon as its top has 128 KiB free and serves large blocks with
    fresh mmaps, under a threshold that moves with what the process freed before. A workload that
    allocates its activations on every call then pays page faults on every call, or not, depending on
    the process's history (BENCHMARKS.md, what this suite found: torch resnet50 on 2 cores). Fixed
    thresholds make every run time the steady state. Blocks above 32 MiB
    (glibc's ceiling) are still mmapped. Returns False where the C library has no mallopt (not glibc).
    """
    mallopt = getattr(ctypes.CDLL(None), "mallopt", None)
    if mallopt is None:
        return False
    return bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_MAX)) and bool(mallopt(M_TRIM_THRESHOLD, 2**30))

"""`threads`: the chosen backend's intra-op threads, set before its first op and recorded; and the worker's
memory layout, fixed unless timing.fixed_layout=false."""

from __future__ import annotations

import ctypes
import json

import pytest
from helpers import compose_config, run_cli

from runner.config import ConfigError, check_combination
from runner.launch import isolation
from runner.record.environment import ADDR_NO_RANDOMIZE
from runner.record.naming import job_spec


def test_numpy_blas_threads_are_set_and_recorded(tmp_path):
    result = isolation.execute(job_spec(compose_config("threads=1", "tracking=none", "isolation=inline")), tmp_path)
    assert result.status == "FINISHED"
    assert result.environment["blas_threads"] == 1
    assert result.config["threads"] == 1


def kernel_allows_a_fixed_layout() -> bool:
    """Whether personality(2) may switch address-space randomization off here (some sandboxes refuse)."""
    libc = ctypes.CDLL(None, use_errno=True)
    before = libc.personality(0xFFFFFFFF)
    allowed = before != -1 and libc.personality(before | ADDR_NO_RANDOMIZE) != -1
    if allowed:
        libc.personality(before)
    return allowed


@pytest.mark.skipif(not kernel_allows_a_fixed_layout(), reason="this kernel or sandbox refuses personality(2)")
def test_torch_threads_in_its_worker_and_a_fixed_layout(tmp_path):
    """A worker process, as a user runs it: torch's intra-op threads as asked; the worker started without
    address-space randomization."""
    out = run_cli("backend=torch", "threads=1", "tracking=none", f"hydra.run.dir={tmp_path}", "timing.max_time_s=0.2")
    assert out.returncode == 0, out.stderr
    record = json.loads((tmp_path / "result.json").read_text())
    assert record["environment"]["torch_num_threads"] == 1
    assert record["environment"]["address_layout_randomized"] is False


def test_a_random_layout_when_asked(tmp_path):
    cfg = compose_config("timing.fixed_layout=false", "tracking=none")
    result = isolation.execute(job_spec(cfg), tmp_path)
    assert result.status == "FINISHED" and result.environment["address_layout_randomized"] is True


@pytest.mark.parametrize("threads", [0, -2])
def test_threads_below_one_are_refused_in_one_line(threads):
    with pytest.raises(ConfigError, match=f"threads={threads}: must be a positive integer"):
        check_combination(compose_config(f"threads={threads}"))

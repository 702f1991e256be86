"""How busy the machine was: read from /proc, own threads not counted, a warning when it was busy."""

from __future__ import annotations

import multiprocessing
import sys
import time

import pytest

from runner.measure.machine_load import MachineLoad, busy_warning

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads Linux's /proc")


def _burn(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def _readings(meter: MachineLoad, seconds: float) -> dict:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        meter.read()
        time.sleep(0.02)
    return meter.metrics([])


def test_another_process_burning_a_core_is_counted_and_warned_about():
    burner = multiprocessing.get_context("spawn").Process(target=_burn, args=(3.0,))
    burner.start()
    try:
        time.sleep(0.5)  # past its start-up
        metrics = _readings(MachineLoad(), 1.0)
    finally:
        burner.join()
    assert metrics["machine_other_runnable"] >= 0.8  # the burner runs nearly all the time
    assert "busy machine while timing" in busy_warning(metrics)


def _fake_proc(root, running: int, steal: int, total: int, own_states: str) -> None:
    """A /proc with `running` runnable threads, CPU jiffies adding up to `total` with `steal` stolen, and
    this process's threads in `own_states` (one letter each)."""
    busy = total - steal
    (root / "stat").write_text(f"cpu  {busy} 0 0 0 0 0 0 {steal} 0 0\ncpu0 1 2 3\nprocs_running {running}\n")
    (root / "loadavg").write_text("3.50 2.00 1.00 4/300 999\n")
    for i, state in enumerate(own_states):
        task = root / "self" / "task" / str(100 + i)
        task.mkdir(parents=True, exist_ok=True)
        (task / "stat").write_text(f"{100 + i} (a thread (odd) name) {state} 1 2 3\n")


def test_own_runnable_threads_are_taken_off_and_steal_is_a_share_of_the_interval(tmp_path):
    _fake_proc(tmp_path, running=5, steal=0, total=1000, own_states="RRS")
    meter = MachineLoad(proc=tmp_path)
    meter.read()
    _fake_proc(tmp_path, running=3, steal=30, total=1200, own_states="RSS")
    meter.read()
    metrics = meter.metrics([])
    assert meter.other_runnable == [3, 2]  # procs_running minus this process's threads in state R
    assert metrics["machine_other_runnable"] == 2.5 and metrics["machine_load_1m"] == 3.5
    assert metrics["machine_steal_pct"] == pytest.approx(100 * 30 / 200)


def test_metrics_and_no_warning_on_a_quiet_reading():
    metrics = {"machine_other_runnable": 0.1, "machine_load_1m": 0.5, "machine_cpus": 2.0, "machine_steal_pct": 0.0}
    assert busy_warning(metrics) is None
    assert "12% CPU steal" in busy_warning({**metrics, "machine_steal_pct": 12.0})


def test_each_sample_of_a_turn_gets_the_busiest_reading_taken_in_that_turn(tmp_path):
    meter = MachineLoad(proc=tmp_path, every_s=0.0)
    _fake_proc(tmp_path, running=2, steal=0, total=1000, own_states="R")
    meter.start()
    values = [meter.after_block(calls=1)]
    _fake_proc(tmp_path, running=5, steal=0, total=1100, own_states="R")
    values.append(meter.after_block(calls=1))
    _fake_proc(tmp_path, running=1, steal=0, total=1200, own_states="R")
    assert meter.end(values) == [4, 4]  # the second reading: 5 runnable, one of them this process
    meter.start()  # a new turn starts afresh
    assert meter.end([-1]) == [0]

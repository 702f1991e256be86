"""The machine's state beside the samples and in the environment: CPU clock and governor, GPU clocks, temperature
and throttle reasons through NVML, each read where readable and said why not elsewhere."""

from __future__ import annotations

import math
import sys
import types
from pathlib import Path

import pytest

from runner.measure.machine_load import CpuClock
from runner.record import environment
from runner.record.machine_state import cpu_state, gpu_state, throttle_names


def fake_proc(tmp_path: Path, *mhz: float) -> Path:
    proc = tmp_path / "proc"
    proc.mkdir(exist_ok=True)
    (proc / "cpuinfo").write_text("".join(f"processor\t: {i}\ncpu MHz\t\t: {m:.3f}\n\n" for i, m in enumerate(mhz)))
    return proc


def test_the_cpu_clock_and_governor_are_read_where_linux_shows_them(tmp_path):
    cpufreq = tmp_path / "cpufreq"
    cpufreq.mkdir()
    (cpufreq / "scaling_governor").write_text("performance\n")
    (cpufreq / "scaling_min_freq").write_text("800000\n")
    (cpufreq / "scaling_max_freq").write_text("3500000\n")
    cpuidle = tmp_path / "cpuidle"
    cpuidle.mkdir()
    (cpuidle / "current_driver").write_text("haltpoll\n")
    state = cpu_state(fake_proc(tmp_path, 2000.0, 3000.0), cpufreq, cpuidle)
    assert state == {
        "cpu_idle_driver": "haltpoll",
        "cpu_mhz": 2500.0,
        "cpu_mhz_min": 2000.0,
        "cpu_mhz_max": 3000.0,
        "cpu_governor": "performance",
        "cpu_freq_min_khz": 800000,
        "cpu_freq_max_khz": 3500000,
    }


def test_a_vm_without_cpufreq_records_the_clock_and_why_there_is_no_governor(tmp_path):
    state = cpu_state(fake_proc(tmp_path, 2596.148), tmp_path / "no-cpufreq", tmp_path / "no-cpuidle")
    assert state["cpu_mhz"] == 2596.148 and "cpu_governor" not in state and "cpu_idle_driver" not in state
    assert "no cpufreq governor readable" in state["cpu_governor_unavailable_reason"]


def test_no_nvidia_driver_reads_no_gpu(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # importing it would raise: it is not imported
    assert gpu_state(tmp_path / "no-driver") == {}


def fake_nvml(fail: bool = False) -> types.ModuleType:
    nvml = types.ModuleType("pynvml")
    nvml.NVML_CLOCK_SM, nvml.NVML_CLOCK_MEM, nvml.NVML_TEMPERATURE_GPU = 1, 2, 0
    nvml.nvmlClocksThrottleReasonNone, nvml.nvmlClocksThrottleReasonAll = 0, 0xFF
    nvml.nvmlClocksThrottleReasonSwPowerCap, nvml.nvmlClocksThrottleReasonHwSlowdown = 0x4, 0x8

    def init():
        if fail:
            raise RuntimeError("Driver Not Loaded")

    nvml.nvmlInit = init
    nvml.nvmlDeviceGetHandleByIndex = lambda index: "gpu0"
    nvml.nvmlDeviceGetCurrentClocksThrottleReasons = lambda handle: 0x4 | 0x8
    nvml.nvmlDeviceGetClockInfo = lambda handle, clock: {1: 1410, 2: 1593}[clock]
    nvml.nvmlDeviceGetTemperature = lambda handle, sensor: 67
    return nvml


def test_a_gpu_records_its_clocks_temperature_and_throttle_reasons(tmp_path, monkeypatch):
    driver = tmp_path / "version"
    driver.write_text("NVRM version: 550.54")
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml())
    assert gpu_state(driver) == {
        "gpu_sm_clock_mhz": 1410,
        "gpu_mem_clock_mhz": 1593,
        "gpu_temperature_c": 67,
        "gpu_throttle_reasons": 12,
        "gpu_throttle_reason_names": "HwSlowdown, SwPowerCap",
    }
    assert throttle_names(fake_nvml(), 0) == "none"


def test_nvml_failing_is_recorded_not_raised(tmp_path, monkeypatch):
    driver = tmp_path / "version"
    driver.write_text("NVRM version: 550.54")
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml(fail=True))
    assert gpu_state(driver) == {"gpu_state_unavailable_reason": "NVML: RuntimeError: Driver Not Loaded"}


def test_the_environment_carries_the_machine_state():
    env = environment.collect({})
    assert "cpu_mhz" in env or "cpu_governor_unavailable_reason" in env or "cpu_governor" in env


def test_the_cpu_clock_series_puts_a_clock_beside_every_sample(tmp_path):
    clock = CpuClock(proc=fake_proc(tmp_path, 2000.0, 2200.0), every_s=0.0)
    clock.start()
    values = [clock.after_block(10) for _ in range(3)]
    assert all(math.isnan(v) for v in values)  # filled in when the run of samples ends
    assert clock.end(values) == [2100.0] * 3
    fake_proc(tmp_path, 1800.0, 1800.0)
    clock.start()
    assert clock.end([clock.after_block(10)]) == [1800.0]
    assert clock.metrics([]) == {"cpu_mhz_min": 1800.0, "cpu_mhz_max": 2100.0}


def test_no_cpuinfo_gives_no_clock(tmp_path):
    clock = CpuClock(proc=tmp_path, every_s=0.0)
    clock.start()
    assert math.isnan(clock.end([clock.after_block(1)])[0]) and clock.metrics([]) == {}


@pytest.mark.parametrize("name", ["sample_cpu_mhz"])
def test_the_clock_series_is_recorded_by_default(name):
    from omegaconf import OmegaConf

    from runner.locations import CONFIG_DIR

    assert name in OmegaConf.load(CONFIG_DIR / "config.yaml").timing.series

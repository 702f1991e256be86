"""What moves timings, read where the machine lets us: the CPU's clock and frequency governor (Linux's /proc and
/sys), and on an NVIDIA GPU its clocks, temperature and throttle reasons (NVML, as pyperf and TorchBench record
them). Nothing unreadable is an error: a VM without cpufreq records the clock /proc/cpuinfo reports and says why the
governor is missing; a machine without an NVIDIA driver reads no GPU and imports nothing for it."""

from __future__ import annotations

import contextlib
from pathlib import Path

PROC = Path("/proc")
CPUFREQ = Path("/sys/devices/system/cpu/cpu0/cpufreq")
CPUIDLE = Path("/sys/devices/system/cpu/cpuidle")
NVIDIA_DRIVER = PROC / "driver/nvidia/version"


def cpu_mhz(proc: Path = PROC) -> list[float]:
    """Each CPU's current clock in MHz as /proc/cpuinfo reports it (empty where it does not)."""
    try:
        text = (proc / "cpuinfo").read_text()
    except OSError:
        return []
    return [float(line.split(":")[1]) for line in text.splitlines() if line.startswith("cpu MHz")]


def cpu_state(proc: Path = PROC, cpufreq: Path = CPUFREQ, cpuidle: Path = CPUIDLE) -> dict:
    """cpu_mhz (mean over CPUs), cpu_mhz_min / _max, and cpu_governor, cpu_freq_min_khz / _max_khz where cpufreq is
    readable, else cpu_governor_unavailable_reason; cpu_idle_driver where cpuidle names one (a VM's haltpoll: how
    soon an idle CPU wakes, which timing.poll_idle changes)."""
    state: dict = {}
    with contextlib.suppress(OSError):
        state["cpu_idle_driver"] = (cpuidle / "current_driver").read_text().strip()
    clocks = cpu_mhz(proc)
    if clocks:
        state.update(cpu_mhz=sum(clocks) / len(clocks), cpu_mhz_min=min(clocks), cpu_mhz_max=max(clocks))
    try:
        state["cpu_governor"] = (cpufreq / "scaling_governor").read_text().strip()
        state["cpu_freq_min_khz"] = int((cpufreq / "scaling_min_freq").read_text())
        state["cpu_freq_max_khz"] = int((cpufreq / "scaling_max_freq").read_text())
    except (OSError, ValueError) as error:
        state.setdefault(
            "cpu_governor_unavailable_reason", f"no cpufreq governor readable ({error.__class__.__name__}: {cpufreq})"
        )
    return state


def gpu_state(driver: Path = NVIDIA_DRIVER) -> dict:
    """The first visible NVIDIA GPU's SM and memory clocks (MHz), temperature (C) and NVML's throttle reasons (a
    bit mask and their names); {} where there is no NVIDIA driver, gpu_state_unavailable_reason where NVML fails."""
    if not driver.exists():
        return {}
    try:
        import pynvml  # light, and imported only where an NVIDIA driver is

        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        reasons = int(pynvml.nvmlDeviceGetCurrentClocksThrottleReasons(handle))
        return {
            "gpu_sm_clock_mhz": pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM),
            "gpu_mem_clock_mhz": pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_MEM),
            "gpu_temperature_c": pynvml.nvmlDeviceGetTemperature(handle, pynvml.NVML_TEMPERATURE_GPU),
            "gpu_throttle_reasons": reasons,
            "gpu_throttle_reason_names": throttle_names(pynvml, reasons),
        }
    except Exception as error:  # no pynvml, an old driver, a GPU NVML does not know: the record says why
        return {"gpu_state_unavailable_reason": f"NVML: {error.__class__.__name__}: {error}"}


def throttle_names(pynvml, mask: int) -> str:
    """NVML's throttle reasons set in `mask`, by name ('SwPowerCap, HwSlowdown'), or 'none'."""
    prefix = "nvmlClocksThrottleReason"
    names = [
        name.removeprefix(prefix)
        for name in dir(pynvml)
        if name.startswith(prefix) and name not in (prefix + "All", prefix + "None") and getattr(pynvml, name) & mask
    ]
    return ", ".join(sorted(names)) or "none"


def machine_state() -> dict:
    """cpu_state() and gpu_state(), for the environment record (runner.record.environment.collect)."""
    return {**cpu_state(), **gpu_state()}

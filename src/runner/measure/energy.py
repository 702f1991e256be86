"""Energy over the timed phase, where the hardware reports it.

NVIDIA GPUs: NVML's total-energy counter (millijoules since the driver loaded; Volta and newer).
CPUs: RAPL's package counters under /sys/class/powercap (microjoules, wrapping at max_energy_range_uj);
they count the whole socket, other processes included. Elsewhere there is no meter, and the record says
why instead of reporting zero.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from types import ModuleType

RAPL_ROOT = Path("/sys/class/powercap")
POWER_LIMIT_MARGIN = 1.1  # the limit holds on average: a timed phase's mean power above 1.1x of it is not real
_PACKAGE = re.compile(r"intel-rapl:\d+$")  # top-level package domains; intel-rapl:0:0 (core) is inside them


class NvmlMeter:
    def __init__(self, nvml, handle):
        self.nvml, self.handle, self._start = nvml, handle, 0

    def _read_mj(self) -> int:
        return self.nvml.nvmlDeviceGetTotalEnergyConsumption(self.handle)

    def start(self) -> None:
        self._start = self._read_mj()

    def stop(self) -> float | None:
        return (self._read_mj() - self._start) / 1e3


class RaplMeter:
    def __init__(self, domains: list[Path]):
        self.domains = domains
        self._start: list[int] = []

    def _read_uj(self) -> list[int]:
        return [int((d / "energy_uj").read_text()) for d in self.domains]

    def start(self) -> None:
        self._start = self._read_uj()

    def stop(self) -> float | None:
        total = 0
        for domain, begin, end in zip(self.domains, self._start, self._read_uj(), strict=True):
            wrap = int((domain / "max_energy_range_uj").read_text()) + 1
            total += (end - begin) % wrap
        return total / 1e6


def meter_for(device: str, rapl_root: Path = RAPL_ROOT) -> tuple[NvmlMeter | RaplMeter | None, dict]:
    """A meter for the device and a note for the record: {"energy_source": ...} or, without a meter,
    {"energy_unavailable_reason": ...}."""
    if device == "cuda":
        return _nvml_meter()
    return _rapl_meter(rapl_root)


def _rapl_meter(root: Path) -> tuple[RaplMeter | None, dict[str, str]]:
    domains = sorted(d for d in root.glob("intel-rapl:*") if _PACKAGE.match(d.name)) if root.is_dir() else []
    if not domains:
        return None, {"energy_unavailable_reason": f"no RAPL package counters on this machine ({root})"}
    meter = RaplMeter(domains)
    try:
        meter.start()
    except OSError as error:  # energy_uj is root-only on most kernels since 2020 (a side channel)
        return None, {"energy_unavailable_reason": f"RAPL counters not readable: {error}"}
    return meter, {"energy_source": f"RAPL package counters ({len(domains)} packages, whole socket)"}


def _nvml_meter() -> tuple[NvmlMeter | None, dict]:
    try:
        nvml, handle = nvml_device()
        meter = NvmlMeter(nvml, handle)
        meter.start()
    except ImportError:
        return None, {"energy_unavailable_reason": "nvidia-ml-py is not installed (pip install nvidia-ml-py)"}
    except Exception as error:  # NVMLError_NotSupported on GPUs older than Volta, or no driver
        return None, {"energy_unavailable_reason": f"NVML total energy unavailable: {error}"}
    note: dict = {"energy_source": "NVML total energy consumption"}
    try:
        note["gpu_power_limit_w"] = nvml.nvmlDeviceGetEnforcedPowerLimit(handle) / 1e3  # milliwatts
    except Exception:  # not every GPU reports it: energy_metrics then has no ceiling to check against
        pass
    return meter, note


def nvml_device() -> tuple[ModuleType, object]:
    """pynvml and the handle of the first GPU this process sees (CUDA_VISIBLE_DEVICES' first entry)."""
    import pynvml

    pynvml.nvmlInit()
    first = os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0].strip() or "0"
    if first.isdigit():
        return pynvml, pynvml.nvmlDeviceGetHandleByIndex(int(first))
    return pynvml, pynvml.nvmlDeviceGetHandleByUUID(first)


def energy_metrics(
    energy_j: float | None, calls: int, examples_per_call: int, timed_s: float = 0.0, power_limit_w: float | None = None
) -> tuple[dict, dict[str, str]]:
    """energy_per_call_j and examples_per_j, or no metric and the reason. A reading that implies more power over the
    timed calls (timed_s) than the GPU's power limit is the counter's lag, not the job's energy: NVML updates it
    every ~100 ms, so turns of interleaved rounds shorter than that are charged with energy their neighbours used
    (a bfloat16 matmul's turns beside a float32 one's read 1.6 kW on a 700 W H100)."""
    if energy_j is None or calls == 0:
        return {}, {}
    if energy_j <= 0:  # NVML updates its counter every ~100 ms; a shorter phase can read no change
        return {}, {"energy_unavailable_reason": "the energy counter did not advance over the timed phase"}
    if power_limit_w and timed_s > 0 and energy_j / timed_s > POWER_LIMIT_MARGIN * power_limit_w:
        return {}, {
            "energy_unavailable_reason": f"the energy counter's reading implies {energy_j / timed_s:.0f} W over the "
            f"timed calls, above the GPU's {power_limit_w:.0f} W limit: it advanced in steps longer than this job's "
            "turns (timing.rounds=1 times one stretch)"
        }
    per_call = energy_j / calls
    return {"energy_per_call_j": per_call, "examples_per_j": examples_per_call / per_call}, {}

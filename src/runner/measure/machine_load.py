"""How busy the machine was while a job was timed, from Linux's /proc: load average, CPU steal and the
number of other runnable threads. Elsewhere (no /proc) nothing is recorded.

`/proc/stat`'s `procs_running` counts every runnable thread, this job's own included, so the job's
own runnable threads (`/proc/self/task/*/stat`, state R) are taken off. Steal is the share of CPU time
the hypervisor gave to other guests between the first and the last reading.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from runner.measure.samples import Series
from runner.record.machine_state import cpu_mhz

PROC = Path("/proc")
BUSY_OTHER_RUNNABLE = 0.5  # other runnable threads, on average: above this, the job shared its cores
BUSY_STEAL_PCT = 5.0  # CPU time stolen by the hypervisor, percent


class MachineLoad(Series):
    """Readings taken between timed blocks, every `every_s`: each sample's value is the most runnable threads
    of other processes read during its run of samples (-1: none read); `metrics()` sums the readings up."""

    def __init__(self, proc: Path = PROC, every_s: float = 0.1):
        self.proc, self.every_s = proc, every_s
        self.other_runnable: list[int] = []
        self.load_1m: list[float] = []
        self.cpu_times: list[tuple[int, int]] = []  # (steal, total) jiffies at each reading
        self.run_readings: list[int | None] = []
        self.last_read = 0.0

    def start(self) -> None:
        # No reading at the very start: the process whose turn just ended may still be winding down.
        self.run_readings, self.last_read = [], time.perf_counter()

    def after_block(self, calls: int) -> int:
        if time.perf_counter() - self.last_read >= self.every_s:
            self.run_readings.append(self.read())
            self.last_read = time.perf_counter()
        return -1

    def end(self, values: list) -> list:
        self.run_readings.append(self.read())
        busiest = max((n for n in self.run_readings if n is not None), default=-1)
        return [busiest] * len(values)

    def read(self) -> int | None:
        """One reading; returns the other processes' runnable threads (None where /proc has no count)."""
        try:
            stat = (self.proc / "stat").read_text()
            loadavg = (self.proc / "loadavg").read_text()
        except OSError:
            return None
        running, others = _field(stat, "procs_running"), None
        if running is not None:
            others = max(running - runnable_threads("self", self.proc), 0)
            self.other_runnable.append(others)
        self.load_1m.append(float(loadavg.split()[0]))
        cpu = stat.splitlines()[0].split()[1:]
        if len(cpu) >= 8:
            jiffies = [int(v) for v in cpu[:8]]  # user nice system idle iowait irq softirq steal
            self.cpu_times.append((jiffies[7], sum(jiffies)))
        return others

    def metrics(self, values: list) -> dict[str, float]:
        """machine_other_runnable (mean), machine_load_1m (mean), machine_steal_pct, machine_cpus."""
        if not self.other_runnable:
            return {}
        metrics = {
            "machine_other_runnable": sum(self.other_runnable) / len(self.other_runnable),
            "machine_load_1m": sum(self.load_1m) / len(self.load_1m),
            "machine_cpus": float(os.cpu_count() or 1),
        }
        if len(self.cpu_times) >= 2:
            (steal0, total0), (steal1, total1) = self.cpu_times[0], self.cpu_times[-1]
            if total1 > total0:
                metrics["machine_steal_pct"] = 100.0 * (steal1 - steal0) / (total1 - total0)
        return metrics


class CpuClock(Series):
    """The CPU's clock beside each sample (MHz, the mean over CPUs that /proc/cpuinfo reports; NaN where it
    reports none), read between timed blocks every `every_s`: a sample's value is its run's mean reading; metrics()
    has the job's lowest and highest (cpu_mhz_min, cpu_mhz_max), so a clock that moved shows beside the times."""

    def __init__(self, proc: Path = PROC, every_s: float = 0.1):
        self.proc, self.every_s = proc, every_s
        self.readings: list[float] = []
        self.run_readings: list[float] = []
        self.last_read = 0.0

    def start(self) -> None:
        self.run_readings, self.last_read = [], float("-inf")

    def after_block(self, calls: int) -> float:
        if time.perf_counter() - self.last_read >= self.every_s:
            clocks = cpu_mhz(self.proc)
            if clocks:
                self.run_readings.append(sum(clocks) / len(clocks))
            self.last_read = time.perf_counter()
        return float("nan")

    def end(self, values: list) -> list:
        self.readings += self.run_readings
        mean = sum(self.run_readings) / len(self.run_readings) if self.run_readings else float("nan")
        return [mean] * len(values)

    def metrics(self, values: list) -> dict[str, float]:
        return {"cpu_mhz_min": min(self.readings), "cpu_mhz_max": max(self.readings)} if self.readings else {}


def runnable_threads(pid: int | str, proc: Path = PROC) -> int:
    """How many threads of process `pid` ("self": this one) are running or runnable now (0 once it is gone)."""
    count = 0
    try:
        tasks = list((proc / str(pid) / "task").iterdir())
    except OSError:
        return 0
    for task in tasks:
        try:
            stat = (task / "stat").read_text()
        except OSError:  # the thread ended meanwhile
            continue
        if stat[stat.rindex(")") + 2 :].startswith("R"):  # the name in parentheses may hold spaces
            count += 1
    return count


def was_busy(other_runnable: float) -> bool:
    """Whether a job timed beside this many other runnable threads on average shared its cores: the one rule of
    every table, answer and history page that says 'busy'."""
    return other_runnable > BUSY_OTHER_RUNNABLE


def busy_warning(metrics: dict[str, float]) -> str | None:
    """A warning when the machine was busy while the job was timed, or None."""
    others = metrics.get("machine_other_runnable", 0.0)
    steal = metrics.get("machine_steal_pct", 0.0)
    if not was_busy(others) and steal <= BUSY_STEAL_PCT:
        return None
    return (
        f"busy machine while timing: {others:.1f} other runnable threads on average, "
        f"load {metrics.get('machine_load_1m', float('nan')):.1f} on {metrics.get('machine_cpus', 0):.0f} CPUs, "
        f"{steal:.0f}% CPU steal; compare jobs measured in the same rounds (a sweep), or quiet the machine"
    )


def _field(stat: str, name: str) -> int | None:
    for line in stat.splitlines():
        if line.startswith(name + " "):
            return int(line.split()[1])
    return None

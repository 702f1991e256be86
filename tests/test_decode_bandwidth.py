"""Decode's bound: the bytes a decode step reads (weights and the key/value cache, counted by hand here), the
bandwidth that makes over the time per token, and the machine's memory bandwidth measured once and kept per kind of
machine. No timing is asserted: only the arithmetic, and that the figures are recorded."""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path

import pytest
from helpers import FAST_TIMING, run_cli

from runner.config import compose
from runner.measure import bandwidth
from runner.measure.job import machine_facts, run_and_record
from runner.models.decoder import Decoder
from runner.models.llama import Llama
from runner.record.naming import job_spec
from runner.tasks.generate import Generate

FAST = ["timing.warmup_s=0", "timing.min_warmup_calls=1", "timing.min_repeats=2", "timing.max_time_s=0.05"]
FAST += ["timing.rounds=1", "tracking=none"]


def test_a_tiny_llamas_decode_step_reads_every_weight_and_the_whole_cache():
    """model=llama's defaults: 2 layers, d 64, 4 heads of 16, 2 key/value heads, ffn 128, vocab 512, untied."""
    per_layer = 2 * 64 + 64 * 64 + 2 * (32 * 64) + 64 * 64 + 3 * 128 * 64  # norms, q, k and v, o, gate/up/down
    weights = 2 * per_layer + 64 + 512 * 64 + 64  # the final norm, lm_head, and one row of embed_tokens
    cache = 2 * 2 * 1 * 2 * 32 * 16  # layers x keys and values x batch x kv heads x positions x head size
    assert Llama().decode_bytes(1, 32, 4) == {"weights": 4 * weights, "kv_cache": 4 * cache}


def test_a_tied_head_is_read_whole_and_a_batch_reads_the_weights_once():
    tied, untied = Llama(tie_embeddings=True), Llama()
    one, eight = tied.decode_bytes(1, 32, 4), tied.decode_bytes(8, 32, 4)
    assert one["weights"] == eight["weights"]  # the embedding is the head: read whole, whatever the batch
    assert untied.decode_bytes(8, 32, 2)["weights"] - untied.decode_bytes(1, 32, 2)["weights"] == 7 * 64 * 2
    assert eight["kv_cache"] == 8 * one["kv_cache"]


def test_gpt2_reads_its_tied_head_whole_and_one_position_row():
    model = Decoder()  # 2 layers, d 64, vocab 512, context 128
    per_layer = 4 * 64 + (64 * 192 + 192) + (64 * 64 + 64) + (64 * 256 + 256) + (256 * 64 + 64)
    weights = 512 * 64 + 64 + 2 * per_layer + 2 * 64  # wte whole, a row of wpe, the blocks, ln_f
    assert model.decode_bytes(1, 20, 8)["weights"] == 8 * weights


def test_achieved_bandwidth_is_the_bytes_over_the_median_time_per_token():
    task = Generate("generate", new_tokens=4)
    task.batch_size, task.decode_bytes = 1, {"weights": 3_000_000, "kv_cache": 1_000_000}
    task.machine = {"GBps": 20.0}
    rows = [[0.01, 0.001, 0.002, 0.001]] * 3
    m = task.metrics(0.02, {"token_latency_s": rows})
    assert m["decode_bytes_per_token"] == 4_000_000
    assert m["decode_bandwidth_GBps"] == pytest.approx(4_000_000 / 0.001 / 1e9)
    assert m["decode_bandwidth_share"] == pytest.approx(4.0 / 20.0)


def test_the_machines_bandwidth_is_measured_once_and_kept_under_its_kind(tmp_path: Path, monkeypatch):
    calls = []
    monkeypatch.setattr(bandwidth, "measure_apart", lambda: calls.append(1) or {"GBps": 12.5})
    monkeypatch.setattr(bandwidth.os, "getloadavg", lambda: (0.2, 0.2, 0.2))  # a quiet machine
    first = bandwidth.machine_bandwidth(tmp_path)
    again = bandwidth.machine_bandwidth(tmp_path)
    assert calls == [1] and first == again and first["GBps"] == 12.5
    (kept,) = tmp_path.glob("*.json")
    assert kept.stem == bandwidth.this_machine().key
    assert json.loads(kept.read_text())["machine"] == bandwidth.this_machine().name


def test_the_jobs_that_find_no_figure_at_once_measure_once_and_read_one_figure(tmp_path: Path, monkeypatch):
    """Issue 77: a sweep's generation jobs recorded 7.9, 9.3 and 20.0 GB/s, each measuring beside the others. While
    one measures, the others wait for its figure: the first measure lets the others start and gives them time to reach
    the probe themselves, which they never do."""
    import threading

    calls, others, reached = [], [], threading.Event()
    seen: list[float] = []

    def others_read() -> None:
        seen.append(bandwidth.machine_bandwidth(tmp_path)["GBps"])

    def measure_apart() -> dict:
        calls.append(1)
        if len(calls) == 1:  # the first job: the others start while it measures
            others.extend(threading.Thread(target=others_read) for _ in range(2))
            for thread in others:
                thread.start()
            reached.wait(timeout=2.0)  # set only by a second measure: none comes where they wait
        else:
            reached.set()
        return {"GBps": 10.0 * len(calls)}

    monkeypatch.setattr(bandwidth, "measure_apart", measure_apart)
    monkeypatch.setattr(bandwidth.os, "getloadavg", lambda: (7.6, 7.6, 7.6))  # busy: the figure is provisional
    seen.append(bandwidth.machine_bandwidth(tmp_path)["GBps"])
    for thread in others:
        thread.join()
    assert calls == [1] and seen == [10.0, 10.0, 10.0]


def test_a_figure_measured_on_a_busy_machine_stands_for_an_hour_then_is_measured_again_and_the_best_kept(
    tmp_path: Path, monkeypatch
):
    """A busy machine lends the measure less bandwidth (28.6 GB/s at load 7.6 here, 55-58 quiet): such a figure is
    provisional. The runs of the next hour read it (a sweep's jobs, busy among themselves, one figure); the first run
    after it measures again and keeps the better; a quiet measure makes it final."""
    figures = iter([{"GBps": 28.6}, {"GBps": 20.0}, {"GBps": 57.0}, {"GBps": 1.0}])
    loads = iter([7.6, 6.0, 0.4, 0.4])
    clock = iter([0.0, 10.0, 3000.0, 3700.0, 3700.0, 7400.0, 7400.0, 90000.0])
    monkeypatch.setattr(bandwidth, "measure_apart", lambda: dict(next(figures)))
    monkeypatch.setattr(bandwidth.os, "getloadavg", lambda: (next(loads), 0.0, 0.0))
    monkeypatch.setattr(bandwidth.time, "time", lambda: next(clock))
    seen = [bandwidth.machine_bandwidth(tmp_path)["GBps"] for _ in range(6)]
    # measured at 0; read at 10 and 3000; measured at 3700 (worse: 28.6 stands); measured quiet at 7400; read at 90000
    assert seen == [28.6, 28.6, 28.6, 28.6, 57.0, 57.0]


def test_the_probe_runs_apart_and_a_failed_probe_is_no_figure(tmp_path: Path, monkeypatch):
    monkeypatch.setattr(bandwidth, "SMALLEST", 8 * 2**20)
    monkeypatch.setattr(bandwidth, "last_level_cache", lambda: 0)
    figures = bandwidth.measure_apart()
    assert figures["array_MB"] == pytest.approx(8 * 2**20 / 1e6, rel=0.01) and figures["GBps"] > 0
    monkeypatch.setattr(bandwidth.sys, "executable", "/bin/false")  # a probe that dies
    assert bandwidth.measure_apart() == {}
    assert bandwidth.machine_bandwidth(tmp_path) == {} and not list(tmp_path.glob("*.json"))


def test_the_stream_measure_counts_what_its_kernels_move():
    figures = bandwidth.measure(array_bytes=8 * 2**20, threads=2)
    assert figures["array_MB"] == pytest.approx(8 * 2**20 / 1e6)
    assert figures["GBps"] == max(figures["copy_GBps"], figures["add_GBps"]) > 0


def test_a_generate_run_records_its_decode_bandwidth_and_the_machines(tmp_path: Path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setattr(bandwidth, "measure_apart", lambda: {"GBps": 10.0, "copy_GBps": 8.0, "add_GBps": 10.0,
                                                       "threads": 2, "array_MB": 134.0})  # fmt: skip
    cfg = compose([*FAST, "model=llama", "task=generate", "task.new_tokens=4", "backend=numpy", "batch_size=1"])
    outcome = run_and_record(job_spec(cfg), tmp_path / "run")
    assert outcome.status == "FINISHED", outcome.error
    m, env = outcome.metrics, outcome.environment
    assert m["decode_bytes_per_token"] == sum(Llama().decode_bytes(1, 16 + 4, 4).values())
    assert m["decode_bandwidth_GBps"] == pytest.approx(m["decode_bytes_per_token"] / m["tpot_p50_s"] / 1e9)
    assert m["decode_bandwidth_share"] == pytest.approx(m["decode_bandwidth_GBps"] / 10.0)
    assert env["machine_bandwidth_GBps"] == "10"
    assert env["machine_bandwidth"].startswith("STREAM Copy 8 GB/s, Add 10 GB/s in NumPy on 2 threads")
    assert list((tmp_path / "cache" / "tensor-runner" / "machines").glob("*.json"))


def test_a_gpus_peak_is_its_memory_bus_width_times_its_highest_memory_clock_double_rated(monkeypatch):
    """An H100 SXM as NVML describes it (5120-bit bus, 2619 MHz): 3.35 TB/s, the figure NVIDIA states; a run on cuda
    reads its decode bandwidth against that, and a machine without NVML gets no share rather than the host's."""
    fake = types.SimpleNamespace(
        NVML_CLOCK_MEM=2,
        nvmlInit=lambda: None,
        nvmlDeviceGetHandleByIndex=lambda index: "gpu0",
        nvmlDeviceGetMemoryBusWidth=lambda handle: 5120,
        nvmlDeviceGetMaxClockInfo=lambda handle, clock: 2619 if clock == 2 else 1980,
        nvmlDeviceGetName=lambda handle: b"NVIDIA H100 80GB HBM3",
    )
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    peak = machine_facts(("memory_bandwidth",), "cuda")["memory_bandwidth"]
    assert peak["GBps"] == pytest.approx(3352.3, abs=0.1)
    assert peak["how"].startswith("NVIDIA H100 80GB HBM3's peak: a 5120-bit memory bus at 2619 MHz")
    monkeypatch.setitem(sys.modules, "pynvml", None)  # not installed: import fails
    assert machine_facts(("memory_bandwidth",), "cuda") == {}
    assert "unavailable" in bandwidth.gpu_peak_bandwidth()


def test_a_generate_runs_peak_memory_is_its_own_not_the_bandwidth_probes(tmp_path: Path):
    """The first generate run on a machine measures its bandwidth (three arrays of 128 MiB or more): in a process of
    its own, so the run's peak host memory stays within 2x of the same model's inference run."""
    env = {"XDG_CACHE_HOME": str(tmp_path / "cache")}  # nothing measured yet: this run probes
    peaks = {}
    for task in ("generate", "inference"):
        run = tmp_path / task
        done = run_cli("model=llama", "backend=numpy", f"task={task}", "tracking=none", f"hydra.run.dir={run}",
                       *FAST_TIMING, env=env)  # fmt: skip
        assert done.returncode == 0, done.stderr[-2000:]
        peaks[task] = json.loads((run / "result.json").read_text())["metrics"]["peak_host_mb"]
    assert list((tmp_path / "cache" / "tensor-runner" / "machines").glob("*.json"))  # the probe ran
    assert peaks["generate"] < 2 * peaks["inference"], peaks

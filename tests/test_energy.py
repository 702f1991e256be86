"""Energy: RAPL counters read across a wrap, and a stated reason wherever no counter can be read."""

from __future__ import annotations

import os

import pytest

from runner.measure.energy import energy_metrics, meter_for


def fake_rapl(root, packages: dict[str, tuple[int, int]]):
    for name, (energy_uj, max_uj) in packages.items():
        domain = root / name
        domain.mkdir(parents=True)
        (domain / "energy_uj").write_text(f"{energy_uj}\n")
        (domain / "max_energy_range_uj").write_text(f"{max_uj}\n")
    (root / "intel-rapl:0:0").mkdir()  # a core sub-domain: inside package 0, never counted twice


def test_rapl_sums_packages_across_a_counter_wrap(tmp_path):
    fake_rapl(tmp_path, {"intel-rapl:0": (999_000_000, 999_999_999), "intel-rapl:1": (5_000_000, 999_999_999)})
    meter, note = meter_for("cpu", tmp_path)
    assert meter is not None and "2 packages" in note["energy_source"]
    meter.start()
    (tmp_path / "intel-rapl:0" / "energy_uj").write_text("1000000\n")  # wrapped: +2,000,000 uJ
    (tmp_path / "intel-rapl:1" / "energy_uj").write_text("6500000\n")  # +1,500,000 uJ
    assert meter.stop() == pytest.approx(3.5)


def test_no_rapl_is_a_reason_not_zero(tmp_path):
    meter, note = meter_for("cpu", tmp_path / "absent")
    assert meter is None and "no RAPL package counters" in note["energy_unavailable_reason"]


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads any file")
def test_unreadable_rapl_is_a_reason(tmp_path):
    fake_rapl(tmp_path, {"intel-rapl:0": (1, 10)})
    (tmp_path / "intel-rapl:0" / "energy_uj").chmod(0)
    meter, note = meter_for("cpu", tmp_path)
    assert meter is None and "not readable" in note["energy_unavailable_reason"]


def test_energy_metrics():
    metrics, note = energy_metrics(10.0, calls=100, examples_per_call=32)
    assert metrics == {"energy_per_call_j": 0.1, "examples_per_j": pytest.approx(320.0)} and note == {}
    assert energy_metrics(None, 100, 32) == ({}, {})
    metrics, note = energy_metrics(0.0, 100, 32)
    assert metrics == {} and "did not advance" in note["energy_unavailable_reason"]


def test_run_records_energy_or_why_not(make_config, tmp_path):
    from runner.measure.job import run_and_record
    from runner.record.naming import job_spec

    outcome = run_and_record(job_spec(make_config("tracking=none", "backend=numpy")), tmp_path)
    env = outcome.environment
    if "energy_per_call_j" in outcome.metrics:
        assert outcome.metrics["examples_per_j"] > 0 and "energy_source" in env
    else:
        assert env["energy_unavailable_reason"]
    assert outcome.metrics["load_s"] >= 0


def test_a_reading_over_the_gpus_power_limit_is_the_counters_lag_not_the_jobs_energy():
    """The H100 sweep's bfloat16 matmul read 2.15 J a call at 1.35 ms a call (1.6 kW on a 700 W GPU): its turns
    were shorter than NVML's ~100 ms counter step, which charged it with its float32 neighbour's energy."""
    metrics, note = energy_metrics(2.15 * 1000, calls=1000, examples_per_call=1, timed_s=1.35, power_limit_w=700.0)
    assert metrics == {}
    reason = note["energy_unavailable_reason"]
    assert "1593 W" in reason and "700 W limit" in reason and "timing.rounds=1" in reason
    metrics, note = energy_metrics(13.06 * 100, calls=100, examples_per_call=1, timed_s=2.17, power_limit_w=700.0)
    assert metrics["energy_per_call_j"] == pytest.approx(13.06) and note == {}  # 602 W: within the limit
    assert energy_metrics(2150.0, 1000, 1, timed_s=1.35)[0]  # no limit known (RAPL, an old GPU): kept as read


def test_the_nvml_meter_records_the_gpus_power_limit(monkeypatch):
    import types

    from runner.measure import energy

    nvml = types.SimpleNamespace(
        nvmlDeviceGetTotalEnergyConsumption=lambda handle: 1_000,
        nvmlDeviceGetEnforcedPowerLimit=lambda handle: 700_000,  # milliwatts
    )
    monkeypatch.setattr(energy, "nvml_device", lambda: (nvml, "gpu0"))
    meter, note = meter_for("cuda")
    assert meter is not None and note == {"energy_source": "NVML total energy consumption", "gpu_power_limit_w": 700.0}

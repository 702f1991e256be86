"""The samples as one record: a series added from outside src/ reaches tensors.h5 and the record, through
a sweep's interleaved rounds too; a series that cannot be used is refused in one line."""

from __future__ import annotations

import json
import os
from pathlib import Path

import h5py
import numpy as np
import pytest
from helpers import FAST_TIMING, run_cli, sweep_cli

from runner.measure.samples import Samples

PLUGIN = Path(__file__).parent / "plugin"
CPU_SERIES = "+timing.series.sample_cpu_s=cpu_time_series.CpuTimePerCall"


@pytest.fixture
def plugin_on_path(monkeypatch):
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(PLUGIN), os.environ.get("PYTHONPATH", "")]))


def test_columns_grow_together_and_a_turn_travels_as_columns():
    samples = Samples()
    samples.add(0.5, 1, {"sample_end_unix_s": 10.0})
    samples.add(0.6, 2, {"sample_end_unix_s": 11.0})
    gathered = Samples()
    gathered.extend(samples.since(1))
    assert gathered.columns == {
        "samples_s": [0.6],
        "sample_round": [2],
        "sample_process": [0],
        "sample_end_unix_s": [11.0],
    }
    assert Samples({"samples_s": [1.0, 2.0]}).rounds == [1, 1]  # one round where none is given
    assert Samples({"samples_s": [1.0, 2.0]}).processes == [0, 0]  # and one process


def test_a_series_from_outside_src_is_recorded_beside_every_sample(tmp_path, plugin_on_path):
    out = run_cli("backend=numpy", "tracking=none", f"hydra.run.dir={tmp_path}", CPU_SERIES, *FAST_TIMING)
    assert out.returncode == 0, out.stderr[-2000:]
    with h5py.File(tmp_path / "tensors.h5") as f:
        wall, cpu = f["timings/samples_s"][()], f["timings/sample_cpu_s"][()]
        assert f["timings/sample_cpu_s"].attrs["units"] == "s"
        assert len(f["timings/sample_end_unix_s"]) == len(wall)  # the built-in series are still there
    assert len(cpu) == len(wall) > 0 and np.all(cpu > 0)
    metrics = json.loads((tmp_path / "result.json").read_text())["metrics"]
    assert metrics["cpu_s_per_call_median"] == pytest.approx(np.median(cpu))


def test_a_series_travels_through_the_interleaved_rounds_of_a_sweep(tmp_path, plugin_on_path):
    out = sweep_cli(tmp_path, "backend=numpy", "model.hidden=8,16", "tracking=none", CPU_SERIES)
    assert out.returncode == 0, out.stderr[-2000:]
    for job in ("0", "1"):
        with h5py.File(tmp_path / "sweep" / job / "tensors.h5") as f:
            rounds, cpu = f["timings/sample_round"][()], f["timings/sample_cpu_s"][()]
        assert len(set(rounds)) > 1 and len(cpu) == len(rounds) and np.all(cpu > 0)


def test_a_series_that_is_not_one_fails_the_job_in_one_line(tmp_path):
    out = run_cli(
        "tracking=none", f"hydra.run.dir={tmp_path}", "+timing.series.bad=runner.models.mlp.MLP", *FAST_TIMING
    )
    saved = json.loads((tmp_path / "result.json").read_text())
    assert out.returncode != 0 and saved["status"] == "FAILED"
    refusal = "timing.series.bad=runner.models.mlp.MLP must be a subclass of runner.measure.samples.Series"
    assert saved["error"] == refusal

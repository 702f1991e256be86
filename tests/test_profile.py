"""timing.profile (runner.measure.profile, issue 75): after the timed calls a job profiles its call with cProfile and
writes profile.pstats and profile.json beside its record, both attached to its MLflow run; the case is the same
(timing.* is how it was measured, not what ran)."""

from __future__ import annotations

import json
from pathlib import Path

from helpers import FAST_TIMING, made_store, run_cli

PLUGIN = Path(__file__).parent / "plugin"
CASE = ["model=chain", "model.features=64", "task=inference", "backend=numpy", "threads=1", "batch_size=8"]


def _profiled(tmp_path: Path, name: str, extra: str, *more: str) -> tuple[Path, str]:
    uri = made_store(tmp_path)
    run_dir = tmp_path / name
    done = run_cli(
        *CASE, *FAST_TIMING, *more,
        f"hydra.searchpath=[file://{PLUGIN / 'conf'}]",
        f"tracking.uri={uri}",
        "tracking.experiment=profiled",
        f"hydra.run.dir={run_dir}",
        env={"PYTHONPATH": str(PLUGIN), "RUNNER_TEST_EXTRA_WORK": extra},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return run_dir, uri


def test_a_profiled_run_records_its_functions_per_call_and_attaches_them(tmp_path):
    from mlflow.tracking import MlflowClient

    run_dir, uri = _profiled(tmp_path, "ten", "", "timing.profile=true")
    summary = json.loads((run_dir / "profile.json").read_text())
    assert summary["profiler"] == "cProfile" and summary["calls"] >= 3
    by_name = {f["function"].rsplit("(", 1)[-1].rstrip(")"): f for f in summary["functions"]}
    assert by_name["linear"]["calls"] == 10 and by_name["forward"]["calls"] == 1  # ten layers a call
    assert (run_dir / "profile.pstats").stat().st_size > 0
    client = MlflowClient(uri)
    (run,) = client.search_runs([client.get_experiment_by_name("profiled").experiment_id])
    assert {"profile.json", "profile.pstats"} <= {a.path for a in client.list_artifacts(run.info.run_id)}
    more, _ = _profiled(tmp_path, "eleven", "0.1", "timing.profile=true")  # RUNNER_TEST_EXTRA_WORK: one more layer
    eleven = {
        f["function"].rsplit("(", 1)[-1].rstrip(")"): f
        for f in json.loads((more / "profile.json").read_text())["functions"]
    }
    assert eleven["linear"]["calls"] == 11
    plain, _ = _profiled(tmp_path, "plain", "")
    assert not (plain / "profile.json").exists() and not (plain / "profile.pstats").exists()
    cases = {json.loads((d / "result.json").read_text())["identity"]["case"]["key"] for d in (run_dir, more, plain)}
    assert len(cases) == 1  # one case: a profile is how it was measured


def test_a_torch_job_is_profiled_by_torch_profiler_its_operators_by_self_time(tmp_path):
    run_dir, _ = _profiled(tmp_path, "torch", "", "timing.profile=true", "backend=torch")
    summary = json.loads((run_dir / "profile.json").read_text())
    assert summary["profiler"] == "torch.profiler" and summary["calls"] >= 3
    by_name = {f["function"]: f for f in summary["functions"]}
    assert by_name["aten::linear"]["calls"] == 10 and by_name["aten::relu"]["calls"] == 10  # ten layers a call
    assert summary["functions"][0]["function"] in ("aten::mm", "aten::addmm", "aten::clamp_min", "aten::relu")
    assert json.loads((run_dir / "profile.trace.json").read_text())["traceEvents"]  # a Chrome trace

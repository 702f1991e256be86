"""Where a step's time went (issue 75): a case whose runs carry profiles (timing.profile) shows, on its history page,
the functions whose self time per call moved most across each step, from the nearest profiled run either side; on
the chain plugin with twice the layers, the layers' own operations move most."""

from __future__ import annotations

import json
import math
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
from helpers import FAST_TIMING, made_store, run_cli, runner_main
from test_history import CONFIG, MACHINE

from runner.history.profiles import moves
from runner.record.result import Result, Status
from runner.tracking.upload import log_to_mlflow

PLUGIN = Path(__file__).parent / "plugin"
CASE = ["model=chain", "model.features=64", "task=inference", "backend=numpy", "threads=1", "batch_size=8"]


def _profile(folder: Path, extra: str) -> dict:
    """profile.json of a real run of the chain plugin (10 layers; 20 with RUNNER_TEST_EXTRA_WORK=1)."""
    done = run_cli(
        *CASE, *FAST_TIMING, "timing.profile=true", "tracking=none",
        f"hydra.searchpath=[file://{PLUGIN / 'conf'}]", f"hydra.run.dir={folder}",
        env={"PYTHONPATH": str(PLUGIN), "RUNNER_TEST_EXTRA_WORK": extra},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads((folder / "profile.json").read_text())


@pytest.fixture(scope="module")
def profiled(tmp_path_factory) -> tuple[str, Path]:
    """A store of 12 nights of one case, 10% slower from the 7th, each run with the profile of a real chain run: 10
    layers before the step, 20 from it on (one more layer, 10%, moved its functions' self times less than two real
    runs' noise on a busy machine); and the folder of its runs."""
    root = tmp_path_factory.mktemp("profiled")
    ten, twenty = _profile(root / "ten", ""), _profile(root / "twenty", "1")
    uri, rng = made_store(root / "store"), np.random.default_rng(4)
    for i in range(12):
        value = 100e-6 * (1.1 if i >= 6 else 1.0) * math.exp(rng.normal(0, 0.01))
        metrics = {"time_typical_s": value, "time_median_s": value, "time_iqr_s": 0.0, "first_call_s": value}
        run_dir = root / "nights" / f"night-{i:02d}"
        run_dir.mkdir(parents=True)
        started = 1.79e9 + 86400 * i
        Result(Status.FINISHED, CONFIG, metrics, MACHINE, started=started, ended=started + 5).save(run_dir)
        (run_dir / "profile.json").write_text(json.dumps(twenty if i >= 6 else ten))
        log_to_mlflow(run_dir, uri, "nightly")
    return uri, root / "nights"


def _diff_rows(page: str) -> list[str]:
    """The functions of the page's profile diff, in its order."""
    table = page.split("<h2>Where the time went: ", 1)[1]
    return re.findall(r"<tr><td>([^<]+)</td>", table)


def test_the_page_of_a_step_names_the_extra_layers_operations_as_the_largest_move(profiled, tmp_path):
    uri, nights = profiled
    for name, source in (("store", ["--tracking-uri", uri]), ("folders", [str(nights)])):
        out = tmp_path / name
        done = runner_main("history", *source, "--html", str(out))
        assert done.returncode == 0, done.stderr
        (page,) = [p.read_text() for p in out.glob("*.html") if p.name != "index.html"]
        assert "<h2>Where the time went: regression: 1.1" in page, page[-2000:]
        said = page.split("Where the time went", 1)[1]
        if name == "folders":  # a run read from its folder is named by it: the nearest profiled either side
            assert "run nights/night-05 (before) and run nights/night-06 (after)" in said, said[:600]
        # what the extra layers run: numpy_backend's linear and relu, and chain_model's forward, whose loop takes a
        # turn per layer (which moved most is the two real profiles' to say: a fresh-clone check saw forward)
        first = _diff_rows(page)[0]
        assert re.search(r"(numpy_backend\.py:\d+\((linear|relu)\)|chain_model\.py:\d+\(forward\))$", first), (
            _diff_rows(page)
        )


def test_moves_put_the_largest_change_of_self_time_first():
    before = {"functions": [{"function": "a", "self_s": 1.0}, {"function": "b", "self_s": 2.0}]}
    after = {"functions": [{"function": "a", "self_s": 1.1}, {"function": "b", "self_s": 1.5}, {"function": "c",
             "self_s": 0.2}]}  # fmt: skip
    assert [(m.function, round(m.moved_s, 6)) for m in moves(before, after)] == [("b", -0.5), ("c", 0.2), ("a", 0.1)]


def test_no_diff_where_a_side_has_no_profile(profiled, tmp_path):
    _, nights = profiled
    folder = tmp_path / "nights"
    shutil.copytree(nights, folder)
    for night in sorted(folder.iterdir())[:6]:
        (night / "profile.json").unlink()
    runner_main("history", str(folder), "--html", str(tmp_path / "page"))
    (page,) = [p.read_text() for p in (tmp_path / "page").glob("*.html") if p.name != "index.html"]
    assert "regression" in page and "Where the time went" not in page


@pytest.mark.heavy  # a real run, a profiled run and a profiled re-run: about 30 s on a quiet machine
def test_a_confirmed_step_shows_the_extra_layers_as_the_largest_move(tmp_path, monkeypatch):
    """The chain case four times as slow from its 7th night (test_history_confirm's store), its nights before the step
    profiled (a real 10-layer run's profile.json attached to each): `--confirm` re-runs it with the work four times
    (40 layers), profiled, and the step's page diffs the 6th night against that re-run."""
    from mlflow.tracking import MlflowClient
    from test_history_confirm import _store_with_a_regression

    from runner.history import confirm, tags

    uri, _ = _store_with_a_regression(tmp_path / "store")
    _profile(tmp_path / "ten", "")
    client = MlflowClient(uri)
    nights = {r.info.run_name: r.info.run_id for r in client.search_runs([client.get_experiment_by_name("nightly")
              .experiment_id])}  # fmt: skip
    for night in range(6):
        client.log_artifact(nights[f"n{night}"], str(tmp_path / "ten" / "profile.json"))
    monkeypatch.setattr(confirm, "output_root", lambda: tmp_path)
    monkeypatch.setenv("PYTHONPATH", str(PLUGIN))
    monkeypatch.syspath_prepend(str(PLUGIN))
    monkeypatch.setenv("RUNNER_TEST_EXTRA_WORK", "3.0")  # 40 layers, not 10
    confirmed = runner_main("history", "--tracking-uri", uri, "--fail-on", "regression", "--confirm")
    assert confirmed.returncode == 1 and "confirmed by a re-run" in confirmed.stderr, confirmed.stderr
    done = runner_main("history", "--tracking-uri", uri, "--html", str(tmp_path / "page"))
    assert done.returncode == 0, done.stderr
    (page,) = [p.read_text() for p in (tmp_path / "page").glob("*.html") if p.name != "index.html"]
    (rerun,) = [r for r in client.search_runs([client.get_run(nights["n0"]).info.experiment_id]) if
                tags.CONFIRMS_TAG in r.data.tags]  # fmt: skip
    said = page.split("<h2>Where the time went: regression: ", 1)[1]
    assert f"cProfile of run {nights['n5'][:12]} (before) and run {rerun.info.run_id[:12]} (after)" in said
    assert re.search(r"\((linear|relu)\)$", _diff_rows(page)[0]), _diff_rows(page)

"""`runner history`'s list of failing cases where a failed run recorded no machine: a SLURM block whose node was lost
before the job read its machine (runner.launch.slurm.record_slurm_end) is named by what is known, never blank."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from helpers import made_store, runner_main
from test_history import MACHINE

from runner.record import job_record, runs
from runner.record.result import Result, Status
from runner.tracking.upload import log_to_mlflow

CASE_NAME = "numpy-mlp-gradients-eager-cpu-float32 batch_size=32"


def _sweep(folder: Path) -> list[Path]:
    """A SLURM sweep's three blocks: two finished on node-1 and node-3, the third's node lost (NODE_FAIL) before its
    job recorded anything, recorded FAILED with SLURM's reason and the node alone, as record_slurm_end does."""
    from runner.config import compose
    from runner.launch.slurm import record_slurm_end
    from runner.launch.slurm_queue import JobState
    from runner.spec import JobSpec

    spec = JobSpec.of(compose(["backend=numpy", "tracking=none"]))
    metrics = {"time_typical_s": 1e-4, "time_median_s": 1e-4, "time_iqr_s": 0.0, "first_call_s": 1e-4}
    for job, host in enumerate(("node-1", "node-3")):
        result = Result(Status.FINISHED, metrics=metrics, environment={**MACHINE, "hostname": host},
                        started=1.79e9 + job)  # fmt: skip
        (folder / str(job)).mkdir(parents=True)
        job_record.write(spec, folder / str(job), result)
    lost = JobState("7_2", "NODE_FAIL", "sinfo: node-2 down* (Not responding)", "9", ": its node is lost", "node-2")
    record_slurm_end(spec, folder / "2", lost)
    return [folder / str(job) for job in range(3)]


def test_a_lost_blocks_failed_run_names_its_node_in_the_failing_list(tmp_path):
    """Before: '... batch_size=32 on : failing since run ...', on the terminal, in --json and on the --html index:
    the block recorded no machine, and its machine's name is empty."""
    uri = made_store(tmp_path / "store")
    ids = [log_to_mlflow(run_dir, uri, "slurm") for run_dir in _sweep(tmp_path / "sweep")]
    said = f"{CASE_NAME} on node-2 (machine unknown): failing since run {ids[2]} ("
    printed = runner_main("history", "--tracking-uri", uri, "--html", str(tmp_path / "pages"))
    assert printed.returncode == 0 and said in printed.stdout and " on : " not in printed.stdout, printed.stdout
    assert "1 run failed, the last: SLURM job 7_2 NODE_FAIL" in printed.stdout
    assert said in (tmp_path / "pages" / "index.html").read_text().split("<h2>Series</h2>")[0]
    cases = json.loads(runner_main("history", "--tracking-uri", uri, "--json").stdout)
    (gap,) = [g for case in cases for g in case["gaps"]]
    assert gap["machine_name"] == "node-2 (machine unknown)" and gap["line"].startswith(said)
    assert all(case["machine_name"] for case in cases)


def test_a_failed_run_with_no_machine_nor_node_says_machine_unknown(tmp_path):
    from runner.history.gaps import gaps

    ran = runs.from_dirs(_sweep(tmp_path / "sweep"))
    ran[2] = dataclasses.replace(ran[2], environment={})  # no node either
    (gap,) = gaps(ran)
    assert gap.machine_name == "machine unknown" and f"{CASE_NAME} on machine unknown: failing since" in gap.line()


def test_a_lost_blocks_failed_run_read_from_its_folder_is_dated_by_its_record_not_1970(tmp_path):
    """Before: 'failing since run sweep/2 (1970-01-01 00:00)': a block whose node was lost recorded no start. Its
    record's time (when record_slurm_end wrote it, at the sweep's end) is what is known, and said as such."""
    import os

    folders = _sweep(tmp_path / "sweep")
    recorded = 1.79e9 + 600  # 2026-09-21 14:23 UTC
    os.utime(folders[2] / "result.json", (recorded, recorded))
    printed = runner_main("history", str(tmp_path / "sweep"))
    assert printed.returncode == 0, printed.stderr[-3000:]
    assert f"{CASE_NAME} on node-2 (machine unknown): failing since run sweep/2 (recorded 2026-09-21 14:23): " in (
        printed.stdout
    ), printed.stdout
    assert "1970" not in printed.stdout


def test_a_failed_run_whose_time_nothing_records_says_date_unknown(tmp_path):
    from runner.history.gaps import gaps

    ran = runs.from_dirs(_sweep(tmp_path / "sweep"))
    ran[2] = dataclasses.replace(ran[2], run_dir=None, name="lost")  # no start, and no record to date it by
    (gap,) = gaps(ran)
    assert f"{CASE_NAME} on node-2 (machine unknown): failing since run lost (date unknown): 1 run" in gap.line()
    assert json.loads(json.dumps(dataclasses.asdict(gap)))["dated"] == "unknown"

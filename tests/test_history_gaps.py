"""`runner history`'s list of failing cases where a failed run recorded no machine: a SLURM block whose node was lost
before the job read its machine (runner.launch.slurm.record_slurm_end) is named by what is known, never blank."""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path

from helpers import made_store, runner_main
from test_history import MACHINE

from runner import identity
from runner.record import job_record, runs
from runner.record.result import Result, Status
from runner.tracking.upload import log_to_mlflow

CASE_NAME = "numpy-mlp-gradients-eager-cpu-float32 batch_size=32"
MACHINE_NAME = identity.machine(MACHINE).name  # AMD EPYC 7B13 · 2 cores · 24 GiB


def _sweep(folder: Path) -> list[Path]:
    """A SLURM sweep's three blocks: two finished on node-1 and node-3, the third's node lost (NODE_FAIL) before its
    job recorded anything, recorded FAILED with SLURM's reason and the node alone, as record_slurm_end does."""
    return _night(folder, 1.79e9)


def _night(folder: Path, started: float, hosts: tuple[str, ...] = ("node-1", "node-3"), lost: str = "node-2"):
    """A SLURM sweep of one case, a block on each of `hosts` finished from `started` on, and a last block on `lost`
    (none where '') whose node was lost (as _sweep's). Its blocks' folders, in job order."""
    from runner.config import compose
    from runner.launch.slurm import record_slurm_end
    from runner.launch.slurm_queue import JobState
    from runner.spec import JobSpec

    spec = JobSpec.of(compose(["backend=numpy", "tracking=none"]))
    metrics = {"time_typical_s": 1e-4, "time_median_s": 1e-4, "time_iqr_s": 0.0, "first_call_s": 1e-4}
    for job, host in enumerate(hosts):
        result = Result(Status.FINISHED, metrics=metrics, environment={**MACHINE, "hostname": host},
                        started=started + job)  # fmt: skip
        (folder / str(job)).mkdir(parents=True)
        job_record.write(spec, folder / str(job), result)
    if lost:
        node = JobState("7_2", "NODE_FAIL", f"sinfo: {lost} down* (Not responding)", "9", ": its node is lost", lost)
        record_slurm_end(spec, folder / str(len(hosts)), node)
    return [folder / str(job) for job in range(len(hosts) + bool(lost))]


def _logged(uri: str, folders: list[Path], night: int) -> list[str]:
    """The night's blocks logged to the store under its sweep's parent run, their run ids; a lost block's run starts
    when it is logged (it recorded no start), at the sweep's end."""
    return [log_to_mlflow(folder, uri, "slurm", parent_run_id=f"{night:032x}") for folder in folders]


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

    ran = runs.from_dirs(_sweep(tmp_path / "sweep"))[2:]  # its sweep's finished blocks aside: undated, it is oldest
    (gap,) = gaps([dataclasses.replace(ran[0], run_dir=None, name="lost")])  # no start, and no record to date it by
    assert f"{CASE_NAME} on node-2 (machine unknown): failing since run lost (date unknown): 1 run" in gap.line()
    assert json.loads(json.dumps(dataclasses.asdict(gap)))["dated"] == "unknown"


ALL = ("node-1", "node-2", "node-3")


def test_a_lost_blocks_failure_is_on_its_nodes_machine_and_the_cases_next_finished_run_clears_it(tmp_path):
    """Night 0 the case ran on node-1..3; night 1 node-2 was lost. Before: its failure was filed under a machine of no
    facts (its own case in --json, 'on node-2 (machine unknown)'), where no run could ever finish, so --fail-on
    failure failed on every night after it. Now it is on the machine node-2 ran the case on: tonight's failure fails
    the gate, and the case's next finished runs there clear it."""
    uri, now = made_store(tmp_path / "store"), time.time()
    _logged(uri, _night(tmp_path / "night0", now - 86_400, ALL, lost=""), 0)
    ids = _logged(uri, _night(tmp_path / "night1", now - 600), 1)
    gate = runner_main("history", "--tracking-uri", uri, "--fail-on", "failure")
    said = f"{CASE_NAME} on {MACHINE_NAME} (node-2, as its other runs of the case recorded it): failing since run"
    assert gate.returncode == 1 and f"failing: {said} {ids[2]} (" in gate.stderr, gate.stderr[-3000:]
    (case,) = json.loads(runner_main("history", "--tracking-uri", uri, "--json").stdout)  # no case of its own
    assert case["machine_name"] == MACHINE_NAME and [g["since_run"] for g in case["gaps"]] == [ids[2]]
    _logged(uri, _night(tmp_path / "night2", now + 600, ALL, lost=""), 2)
    gate = runner_main("history", "--tracking-uri", uri, "--fail-on", "failure")
    assert gate.returncode == 0 and "failing" not in gate.stdout + gate.stderr, gate.stdout + gate.stderr


def test_machine_reads_the_lost_blocks_failures_placed_on_that_machine(tmp_path):
    """Before: `--machine KEY` read no lost block's failure (it recorded no machine to filter on), so a nightly gate
    narrowed to one kind of machine passed on the night a node was lost. Now one its node's runs place there fails
    it; one on a node that ran the case nowhere is on no machine known, not this one's."""
    uri, now = made_store(tmp_path / "store"), time.time()
    _logged(uri, _night(tmp_path / "night0", now - 86_400, ("node-1", "node-2"), lost=""), 0)
    ids = _logged(uri, _night(tmp_path / "night1", now - 600, ("node-1",), lost="node-2"), 1)
    on_machine = ("history", "--machine", identity.machine(MACHINE).key, "--fail-on", "failure")
    gate = runner_main(*on_machine, "--tracking-uri", uri)
    said = f"{CASE_NAME} on {MACHINE_NAME} (node-2, as its other runs of the case recorded it): failing since run"
    assert gate.returncode == 1 and f"failing: {said} {ids[1]} (" in gate.stderr, gate.stderr[-3000:]
    elsewhere = made_store(tmp_path / "elsewhere")
    _logged(elsewhere, _night(tmp_path / "node9", now - 600, ("node-1",), lost="node-9"), 0)
    assert runner_main("history", "--tracking-uri", elsewhere, "--fail-on", "failure").returncode == 1
    gate = runner_main(*on_machine, "--tracking-uri", elsewhere)
    assert gate.returncode == 0 and "node-9" not in gate.stdout + gate.stderr, gate.stdout + gate.stderr


def test_a_lost_block_on_a_node_that_never_ran_the_case_is_cleared_by_the_cases_next_finished_run(tmp_path):
    """node-2 ran the case neither before nor after: its machine is unknown, so the case's next finished run, on any
    machine, clears its failure (before: it failed the gate every night after)."""
    uri, now = made_store(tmp_path / "store"), time.time()
    _logged(uri, _night(tmp_path / "night1", now - 600), 1)
    gate = runner_main("history", "--tracking-uri", uri, "--fail-on", "failure")
    assert gate.returncode == 1 and f"failing: {CASE_NAME} on node-2 (machine unknown): failing since" in gate.stderr
    _logged(uri, _night(tmp_path / "night2", now + 600, ("node-1",), lost=""), 2)
    gate = runner_main("history", "--tracking-uri", uri, "--fail-on", "failure")
    assert gate.returncode == 0 and "failing" not in gate.stdout + gate.stderr, gate.stdout + gate.stderr


def test_a_lost_blocks_failure_read_from_folders_is_on_its_nodes_machine_until_the_next_night(tmp_path):
    """The same from the sweeps' folders, the lost block dated by its record (at its sweep's end)."""
    import os

    _night(tmp_path / "night0", 1.79e9, ALL, lost="")
    lost = _night(tmp_path / "night1", 1.79e9 + 86_400)[-1]
    os.utime(lost / "result.json", (1.79e9 + 87_000, 1.79e9 + 87_000))
    gate = runner_main("history", str(tmp_path), "--fail-on", "failure")
    said = f"{CASE_NAME} on {MACHINE_NAME} (node-2, as its other runs of the case recorded it): failing since run"
    assert gate.returncode == 1 and f"{said} night1/2 (recorded 2026-09-22 14:23)" in gate.stdout, gate.stdout
    on_machine = runner_main("history", str(tmp_path), "--machine", identity.machine(MACHINE).key, "--fail-on",
                             "failure")  # fmt: skip
    assert on_machine.returncode == 1 and f"{said} night1/2 (recorded" in on_machine.stdout, on_machine.stderr
    _night(tmp_path / "night2", 1.79e9 + 2 * 86_400, ALL, lost="")
    gate = runner_main("history", str(tmp_path), "--fail-on", "failure")
    assert gate.returncode == 0 and "failing" not in gate.stdout + gate.stderr, gate.stdout + gate.stderr


def test_case_and_machine_narrow_the_runs_read_from_folders(tmp_path):
    """Before: `runner history DIR --case KEY` (or --machine KEY) read every run in DIR whatever key it named, and
    --experiment was ignored without a word. Now the keys narrow a folder's runs as MLflow's tags narrow a store's,
    and --experiment, which a folder has not, is refused in one line."""
    _night(tmp_path / "night0", 1.79e9, ALL, lost="")
    case = identity.machine(MACHINE).key  # a key, but no case's
    for option in ("--case", "--machine"):
        other = runner_main("history", str(tmp_path), option, "0" * 16 if option == "--machine" else case)
        assert other.returncode == 2 and "no finished run" in other.stderr, other.stdout + other.stderr
    refused = runner_main("history", str(tmp_path), "--experiment", "nightly")
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1 and "--experiment" in refused.stderr

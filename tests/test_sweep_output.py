"""What a sweep prints, kept short (issue 36): one line per job, a few progress lines, the table, each
warning once with its jobs; through `logging`, so Hydra's logging config silences or redirects it."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import run_cli

from runner.launch.sweep_lines import PlainFormatter, grouped_warnings, jobs_text, time_left
from runner.record.result import Result

TABLE = ("┏", "┃", "┡", "│", "└", "Sweep: ")  # the table's lines: its title, heading, rows and rules


def _sweep(tmp: Path, *overrides: str):
    return run_cli(
        "-m",
        "backend=numpy",
        "tracking=none",
        f"hydra.sweep.dir={tmp}/sweep",
        "timing.max_time_s=0.2",
        "timing.warmup_s=0.01",
        *overrides,
        timeout=300,
    )


@pytest.fixture(scope="module")
def eight_jobs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("eight-jobs")
    return tmp, _sweep(tmp, "seed=range(8)")


def test_an_eight_job_sweep_prints_a_line_per_job_and_a_few_more_beside_its_table(eight_jobs):
    tmp, result = eight_jobs
    assert result.returncode == 0, result.stderr[-3000:]
    lines = [line for line in (result.stdout + result.stderr).splitlines() if line.strip()]
    table = [line for line in lines if line.startswith(TABLE)]
    assert len(table) == 8 + 5, "\n".join(lines)  # title, rules, heading, one row per job
    others = [line for line in lines if not line.startswith(TABLE)]
    job_lines = [line for line in others if " · numpy-mlp-gradients-eager-cpu-float32 #" in line]
    assert len(job_lines) == 8 and any("[3/8] " in line and ": FINISHED, median " in line for line in job_lines)
    assert len(others) <= 8 + 10, "\n".join(others)  # before: ~25 lines per job
    assert not any(line.startswith("  median") for line in others)  # no single-run summary per job
    warned = [line for line in others if "busy machine" in line or "warm-up cut short" in line]
    assert all(line.endswith(")") and "job" in line.rsplit("(", 1)[-1] for line in warned)  # once, with its jobs


def test_each_job_has_its_line_in_the_log_file_hydra_gives_it(eight_jobs):
    tmp, _ = eight_jobs
    log = (tmp / "sweep" / "2" / "run.log").read_text()
    assert "[3/8] seed=2 · numpy-mlp-gradients-eager-cpu-float32 #2: FINISHED, median" in log
    assert (tmp / "sweep" / "2" / "job.log").exists()  # the worker's own output, kept whole


def test_a_quiet_sweep_prints_its_table_without_the_job_lines_and_verbose_shows_debug(tmp_path):
    result = _sweep(tmp_path, "seed=0,1", "hydra/job_logging=disabled", "hydra.verbose=runner")
    assert result.returncode == 0, result.stderr[-3000:]
    output = result.stdout + result.stderr
    assert "Sweep: 2 jobs" in output and "[1/2]" not in output and "FINISHED, median" not in output
    assert "set up in 1 process; waits for its" in output  # hydra.verbose=runner: the launcher's debug lines


def test_warnings_that_differ_in_their_numbers_are_one_line_with_ranges_and_their_jobs():
    busy = "busy machine while timing: {} other runnable threads on average, load 1.7 on 2 CPUs"
    lines = grouped_warnings(
        [
            ("0", [busy.format("2.1"), "noisy measurement: IQR is 113% of the median"]),
            ("1", [busy.format("2.3")]),
            ("3", [busy.format("2.2")]),
        ]
    )
    assert lines == [
        "busy machine while timing: 2.1-2.3 other runnable threads on average, load 1.7 on 2 CPUs (jobs 0, 1, 3)",
        "noisy measurement: IQR is 113% of the median (job 0)",
    ]
    assert jobs_text(["3", "0", "1", "2", "7"]) == "jobs 0-3, 7"


def test_the_time_left_goes_by_the_pace_so_far_and_plain_lines_say_what_warns():
    import logging

    assert time_left(2.0, 10, 40) == ", about 6 s left"
    assert time_left(2.0, 40, 40) == ""
    record = logging.LogRecord("runner", logging.WARNING, __file__, 1, "noisy", None, None)
    assert PlainFormatter().format(record) == "warning: noisy"


def test_a_failed_job_s_line_says_why(tmp_path):
    from runner.launch.sweep_lines import job_line

    result = Result(status="FAILED", error="backend=numpy cannot compute in dtype=bfloat16")
    assert job_line(tmp_path / "4", result) == "4: FAILED: backend=numpy cannot compute in dtype=bfloat16"

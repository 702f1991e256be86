"""The temporary folders of a job's other worker processes: a killed launcher's are removed by the next launch,
never those of a launcher that still runs."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from helpers import FAST_TIMING, made_store, sweep_cli

from runner.config import PROJECT_ROOT
from runner.launch import process_dirs


def _dead_pid() -> int:
    """The id of a process that has ended and been reaped."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_only_the_folders_of_launchers_that_are_gone_are_removed(own_tmpdir):
    gone = _dead_pid()
    dead, live = own_tmpdir / f"0.1-runner-process-{gone}-a1b2c3d4", own_tmpdir / f"0.1-runner-process-{os.getpid()}-x"
    older = own_tmpdir / "0.1-runner-process-k3j4h5g6"  # named before folders carried their launcher: whose is unknown
    not_a_folder = own_tmpdir / f"2.1-runner-process-{gone}-file"
    for folder in (dead, live, older):
        folder.mkdir()
        (folder / "job.log").write_text("")
    not_a_folder.write_text("")
    assert process_dirs.remove_orphans() == [dead]
    assert sorted(own_tmpdir.iterdir()) == sorted([live, older, not_a_folder])


def test_a_sweep_after_a_killed_one_removes_the_killed_ones_worker_folders(tmp_path, own_tmpdir):
    """The launcher of a sweep in its rounds is killed (SIGKILL: it removes nothing); the next sweep on the machine
    removes its jobs' second processes' folders, and leaves a live launcher's."""
    killed = _killed_in_its_rounds(tmp_path / "killed")
    left = sorted(own_tmpdir.glob(f"*-runner-process-{killed}-*"))
    assert [p.name.split("-")[0] for p in left] == ["0.1", "1.1"], sorted(own_tmpdir.iterdir())
    live = own_tmpdir / f"0.1-runner-process-{os.getpid()}-planted"
    live.mkdir()
    done = sweep_cli(tmp_path / "next", "backend=numpy", "tracking=none", "timing.rounds=2", new_store=True)
    assert done.returncode == 0, done.stderr[-3000:]
    assert not any(p.exists() for p in left)
    assert live.is_dir()


def _killed_in_its_rounds(tmp: Path) -> int:
    """Start a sweep of two numpy jobs in 20 rounds of 2 processes each and kill its launcher once round 1 is done;
    its pid."""
    tmp.mkdir()
    args = [f"tracking.uri={made_store(tmp)}", "tracking.experiment=sweeps", f"hydra.sweep.dir={tmp}/sweep"]
    rounds = ["timing.rounds=20", "timing.processes=2", "timing.max_time_s=4", "timing.resolve=0"]
    proc = subprocess.Popen(
        [sys.executable, str(PROJECT_ROOT / "run.py"), "-m", *args, *FAST_TIMING, *rounds, "backend=numpy", "seed=0,1"],
        env={**os.environ, "PYTHONPATH": str(PROJECT_ROOT / "src")},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    lines: list[str] = []
    threading.Thread(target=lambda: lines.extend(proc.stdout or ()), daemon=True).start()
    deadline = time.monotonic() + 240
    while not any("round 1 of 20 done" in line for line in lines):
        assert proc.poll() is None and time.monotonic() < deadline, "".join(lines)[-3000:]
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    return proc.pid

"""`runner history`, `runner compare` and `runner report` refuse bad input in one line and a non-zero exit: a store
that is no store, a path mistyped, a server that does not answer, a filter value, an option that makes no sense.
Reading never creates a store, and nothing already printed is followed by a traceback."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest
from helpers import FAST_TIMING, run_cli, runner_main


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # nothing listens there once the socket closes


def _one_line_refusal(result, *said: str) -> None:
    """One line, `error: ...`, and exit 2 (as argparse's refusals: runner history's 1 is what its gate found)."""
    assert result.returncode == 2, (result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert "Traceback" not in result.stdout + result.stderr
    for words in said:
        assert words in lines[0], lines[0]


@pytest.fixture
def junk(tmp_path) -> Path:
    (tmp_path / "notes.db").write_text("not a database\n")
    (tmp_path / "folder").mkdir()
    (tmp_path / "a-file").write_text("x\n")
    return tmp_path


STORES = {
    "a file that is not a database": ("sqlite:///{tmp}/notes.db", "is not an SQLite database"),
    "an unknown scheme": ("foo://bar", "not a store MLflow reads"),
    "a plain folder path": ("{tmp}/folder", "not a store MLflow reads"),
    "a mistyped path": ("sqlite:///{tmp}/typo/mlflow.db", "no MLflow store at"),
    "a server that does not answer": ("http://127.0.0.1:{port}", "does not answer"),
}


@pytest.mark.parametrize("what", list(STORES))
@pytest.mark.parametrize("command", ["history", "report", "compare"])
def test_a_store_that_cannot_be_read_is_one_line_and_none_is_created(junk, what, command):
    template, said = STORES[what]
    uri = template.format(tmp=junk, port=_closed_port())
    args = {
        "history": ["history", "--tracking-uri", uri],
        "report": ["report", "--tracking-uri", uri, "--experiment", "x", "--out", str(junk / "report")],
        "compare": ["compare", "0" * 32, "1" * 32, "--tracking-uri", uri],
    }[command]
    before = sorted(p.name for p in junk.rglob("*"))
    _one_line_refusal(runner_main(*args), said)
    assert sorted(p.name for p in junk.rglob("*")) == before  # no store, no folder, no report made


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["history", "--tracking-uri", "sqlite:///{tmp}/notes.db", "--case", "a'b"], "--case a'b: a key is 16 hex"),
        (["history", "--tracking-uri", "sqlite:///{tmp}/notes.db", "--machine", "x"], "--machine x: a key is 16 hex"),
        (["history", "--why", "new machine"], "give --mark RUN_ID too"),
        (["compare", "a", "b", "--factor", "inf"], "--factor inf: it must be a number from 1 up"),
        (["compare", "a", "b", "--factor", "nan"], "--factor nan"),
        (["compare", "a", "b", "--factor", "0.5"], "--factor 0.5"),
        (["history", "{tmp}/folder", "--html", "{tmp}/a-file"], "is a file, not a folder"),
        (["history", "{tmp}/folder", "--html", "{tmp}/a-file/pages"], "is a file, not a folder"),
        (["report", "--sweep-dir", "{tmp}/folder", "--out", "{tmp}/a-file/report"], "is a file, not a folder"),
        (["history", "{tmp}/folder", "--html", "{tmp}/" + "y" * 300], "is 300 bytes long, and"),
        (["report", "--sweep-dir", "{tmp}/folder", "--out", "/proc/report"], "cannot create folders in /proc"),
    ],
)
def test_options_that_make_no_sense_are_refused_in_one_line(junk, args, said):
    _one_line_refusal(runner_main(*(a.format(tmp=junk) for a in args)), said)


@pytest.fixture(scope="module")
def sweeps(tmp_path_factory) -> Path:
    """A sweep whose only job was refused (FAILED), and one that finished."""
    tmp = tmp_path_factory.mktemp("sides")
    failed = run_cli("-m", "tracking=none", "model=matmul", "task=gradients", f"hydra.sweep.dir={tmp}/failed")
    finished = run_cli(
        "-m", f"tracking.uri=sqlite:///{tmp}/mlflow.db", "model=matmul", "task=inference", *FAST_TIMING,
        f"hydra.sweep.dir={tmp}/finished",
    )  # fmt: skip
    assert failed.returncode == 1 and finished.returncode == 0, finished.stderr[-2000:]
    return tmp


@pytest.mark.parametrize("failed_side", ["before", "after"])
def test_compare_with_a_side_that_has_no_finished_run_says_so(sweeps, failed_side):
    sides = [str(sweeps / "failed"), str(sweeps / "finished")]
    result = runner_main("compare", *(sides if failed_side == "before" else sides[::-1]))
    _one_line_refusal(result, f"{sweeps / 'failed'} has no finished, timed run to compare (1 run: FAILED)")


def test_history_with_an_html_folder_it_cannot_write_prints_nothing_before_refusing(sweeps, tmp_path):
    (tmp_path / "taken").write_text("x\n")
    result = runner_main("history", str(sweeps / "finished"), "--html", str(tmp_path / "taken"))
    _one_line_refusal(result, "is a file, not a folder")
    assert result.stdout == ""
    fine = runner_main("history", str(sweeps / "finished"), "--json", "--html", str(tmp_path / "pages"))
    assert fine.returncode == 0 and json.loads(fine.stdout) and (tmp_path / "pages" / "index.html").is_file()


# The fuzz's values: each a realistic mistake or an absurd value, beside a few that work ({sweeps}: the module's sweeps
# and their store; {tmp}: the junk folder; {port}: a port nobody listens on; {run}: a run id in the store).
VALUES = {
    "store": [
        "sqlite:///{sweeps}/mlflow.db",
        "sqlite:///{tmp}/notes.db",
        "foo://bar",
        "{tmp}/folder",
        "",
        "sqlite:///{tmp}/typo/mlflow.db",
        "http://127.0.0.1:{port}",
        "sqlite://",
        "file:///no/such/place",
    ],
    "side": [
        "{sweeps}/finished",
        "{sweeps}/failed",
        "{tmp}/nothing",
        "{tmp}/a-file",
        "{tmp}/folder",
        "0" * 32,
        "zz",
        "",
        "'; drop table runs; --",
        "{run}",
    ],
    "text": ["a'b", 'x"y', "", " ", "\n", "%", "é", "0" * 16, "-", "regression", "tensor-runner"],
    "number": ["0", "-1", "1", "1.1", "inf", "nan", "1e309", "abc", ""],
    "folder": ["{tmp}/out", "{tmp}/a-file", "{tmp}/a-file/sub", "/proc/no-such", ""],
}
OPTIONS = {  # subcommand -> (option, kind of value); option None: a positional argument
    "history": [("--tracking-uri", "store"), ("--experiment", "text"), ("--case", "text"), ("--machine", "text"),
                ("--by-host", None), ("--json", None), ("--html", "folder"), ("--fail-on", "text"), ("--mark", "side"),
                ("--why", "text"), (None, "side")],
    "compare": [(None, "side"), (None, "side"), ("--tracking-uri", "store"), ("--factor", "number")],
    "report": [("--experiment", "text"), ("--sweep-dir", "side"), ("--tracking-uri", "store"), ("--parent", "side"),
               ("--out", "folder")],
    "sync": [(None, "side"), ("--tracking-uri", "store")],
}  # fmt: skip


def _fuzzed(rng, junk: Path, sweeps: Path, run_id: str) -> list[str]:
    command = rng.choice(sorted(OPTIONS))
    args = [command]
    for option, kind in OPTIONS[command]:
        if rng.random() < 0.5:
            continue
        if option:
            args.append(option)
        if kind:
            args.append(rng.choice(VALUES[kind]).format(tmp=junk, sweeps=sweeps, port=_closed_port(), run=run_id))
    return args


def test_a_fuzz_of_the_commands_options_gives_no_traceback(junk, sweeps, monkeypatch):
    """300 seeded command lines of bad stores, paths, ids and values: each exits 0, or non-zero with its last line
    an error (argparse's usage error, or one line of the runner's), and never a traceback."""
    import random

    import mlflow

    run_id = mlflow.MlflowClient(f"sqlite:///{sweeps}/mlflow.db").search_runs(["0", "1"])[0].info.run_id
    monkeypatch.chdir(junk)  # a relative path the fuzz makes up lands here, never in the checkout
    before = set(junk.iterdir())
    rng = random.Random(65)
    wrong = []
    for _ in range(300):
        args = _fuzzed(rng, junk, sweeps, run_id)
        result = runner_main(*args)
        lines = result.stderr.strip().splitlines()
        refused = bool(lines) and (lines[-1].startswith("error: ") or ": error: " in lines[-1])
        if (
            "Traceback" in result.stdout + result.stderr
            or result.returncode not in (0, 1, 2)
            or (result.returncode and not refused)
        ):
            wrong.append((args, result.returncode, result.stderr[-500:]))
    assert not wrong, "\n".join(map(str, wrong))
    assert {p.name for p in set(junk.iterdir()) - before} <= {"out"}  # only what an --html or --out named

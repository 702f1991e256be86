"""Every Python script and `runner` subcommand the documentation prints runs, as printed, in a test (issue 74).

Collected when the tests are collected, from the pages test_readme_commands.py reads (README.md, docs/*.md,
experiments/README.md) and the comment headers of experiments/*.yaml, so a command added to a page is tested without
touching this file:
- every line of a fenced code block and every inline code span that calls a Python script (`python SCRIPT.py ...`,
  `.venv/bin/python SCRIPT.py ...`, run.py aside) or `runner` with a subcommand (`runner history --json`), in
  a command's place (first, after `&&`, `;`, `$(`, or a CI file's `- run:`);
- not: a span that names a subcommand alone (`runner sync`, prose), a span that shows a form (a lone `...`), and
  run.py's own commands (`runner run`, `python -m runner run`, `tensor-runner`), which test_readme_commands.py runs.

Each runs through bash, as printed, from a user's folder laid out as the checkout the docs speak from: `.venv` (this
interpreter's environment), src/, conf/ and run.py linked, copies of experiments/, benchmarks/ and scripts/ (what
a script writes beside itself lands in the copy), and outputs/ holding an MLflow store with two small sweeps, at the
dates the docs print (outputs/multirun/2026-11-22/14-57-12 in experiment tensor-runner, then 2026-11-25/09-12-40 in
nightly, as the CI examples name it). The environment is the CI examples' (MLFLOW_TRACKING_URI and STORE name that
store).
A placeholder the docs print (SWEEP_DIR, RUN_ID, ...) is filled from that folder (PLACEHOLDERS); one this file does not
know fails. A command must exit 0 and write what it says it writes (`--out DIR`, `--html DIR`, `> FILE`; `--json` is
JSON). SKIPPED holds the commands that need what a test machine lacks, each with its reason; LONG, those that take
minutes, with their marker.

They run with `-m heavy` (CI runs it after the default set): each is a fresh process, about 10 s of imports on 2 busy
cores, of a subcommand whose behaviour the default set tests in-process (test_history*.py, test_report.py, ...);
experiments/summarize.py runs in the default set too (test_experiments.py).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from helpers import FAST_TIMING
from test_readme_commands import SEPARATORS, _tokens, documentation_pages

from runner.config import PROJECT_ROOT

# Commands that need what a test machine lacks (pattern in the command as printed -> why it is not run here)
SKIPPED = {
    r"runner bisect numpy==": "installs numpy releases from the package index (network); tests/test_bisect.py bisects "
    "releases built locally (wheels in a folder)",
    r"git\+file:///path/repo@GOOD_SHA": "needs the user's own package repository and two of its commits; "
    "tests/test_bisect.py bisects the commits of a repository it makes",
    r"^runner history --confirm$": "an option named in prose (docs/architecture.md's module map): alone it is refused "
    "as it should be (--confirm re-runs what --fail-on flags); docs/history.md's commands with --confirm run here",
    r"lock_gate\.py .*github\.base_ref": "a GitHub Actions step: needs the pull request's base branch and installs "
    "both locks' pins from the package index (network); tests/test_bisect.py checks the gate's comparison of pins",
}
# Commands that take minutes (pattern -> (marker, why))
LONG = {
    r"benchmarks/run_all\.py$": ("slow", "the measurement-quality suite: about 8 minutes on 2 cores"),
    r"benchmarks/prefill_scaling\.py$": ("slow", "runs its sweep first: 7 generation jobs up to 1024 prompt tokens"),
}
# What a command writes that says more than its exit status (pattern -> (file it writes in the user's folder, what
# must not be in it)): run_all.py goes on past a row it cannot measure, and says so in its table
WRITES = {r"benchmarks/run_all\.py$": ("BENCHMARKS.md", "could not be measured")}
# What a placeholder the docs print stands for, here: a path in the user's folder or a field of its store (Store)
PLACEHOLDERS = {
    "SWEEP_DIR": "{before}",
    "SWEEP": "{before}",
    "BEFORE": "{before}",
    "AFTER": "{after}",
    "/shared/sweeps/DIR": "{before}",  # a sweep kept on a cluster's shared disk
    "RUN_DIR": "{run_dir}",
    "DIR": "pages",  # a folder a command writes (--out DIR, --html DIR)
    "URI": "{uri}",
    "NAME": "{experiment}",
    "PARENT_RUN_ID": "{parent}",
    "BEFORE_RUN_ID": "{parent}",
    "AFTER_RUN_ID": "{after_parent}",
    "RUN_ID": "{run_id}",
    "NAMES": "time_typical_s,first_call_s",  # runner history --series: the series of two metrics
    "http://mlflow.team:5000": "{uri}",  # a team's server: the same client calls on the store here
}
BEFORE, AFTER = "outputs/multirun/2026-11-22/14-57-12", "outputs/multirun/2026-11-25/09-12-40"
STORE_URI = "sqlite:///outputs/mlflow.db"
COMMAND_PLACE = SEPARATORS | {"(", "-", "run:", "script:"}  # a shell's, and a CI file's step (`- run: CMD`)
PLACEHOLDER = re.compile(r"(?<![$\w])[A-Z][A-Z_]+(?![a-z])")


@dataclass(frozen=True)
class DocCommand:
    source: str  # file:line
    text: str  # the command as printed, alone (what precedes `&&` or follows it is another command)
    words: tuple[str, ...]  # its words, from the script or `runner` on


def parse(text: str, source: str) -> DocCommand | None:
    """The script or runner command in a shell line, if there is one."""
    try:
        tokens = _tokens(text.strip().removeprefix("$ "))
    except ValueError:  # not a shell line (a program's output, a yaml block)
        return None
    for i, token in enumerate(tokens):
        in_place = i == 0 or tokens[i - 1] in COMMAND_PLACE or re.fullmatch(r"[A-Z_]+=.*", tokens[i - 1]) is not None
        python, rest = re.fullmatch(r"(.*/)?python[0-9.]*", token), tokens[i + 1 :]
        if python and rest[:2] == ["-m", "runner"]:
            subcommand = rest[2] if len(rest) > 2 else None
        elif in_place and re.fullmatch(r"(.*/)?runner", token):
            subcommand = rest[0] if rest else None
        elif python and rest and rest[0].endswith(".py"):
            subcommand = "run" if rest[0].endswith("run.py") else rest[0]
        else:
            continue
        if subcommand in (None, "run"):  # a name in prose, or run.py's command (test_readme_commands.py)
            return None
        start = i
        end = next((j for j in range(start, len(tokens)) if tokens[j] in SEPARATORS | {")"}), len(tokens))
        words = tuple(tokens[start:end])
        return DocCommand(source, _shell(words), words)
    return None


def _shell(words: tuple[str, ...]) -> str:
    """The words as bash reads them: a redirection as it is, a variable expanded, the rest quoted."""
    return " ".join(w if w in (">", ">>") else f'"{w}"' if w.startswith("$") else shlex.quote(w) for w in words)


def is_command(command: DocCommand) -> bool:
    """Whether a code span is a command: a script, or a subcommand with an argument, or an option (`runner --help`);
    not a subcommand's name alone (prose) nor a form (a lone `...`)."""
    tool = 3 if command.words[1:3] == ("-m", "runner") else 1
    script, rest = command.words[1].endswith(".py"), command.words[tool:]
    return "..." not in command.words and (script or len(rest) > 1 or rest[0].startswith("-"))


def _spans(page: Path) -> list[tuple[str, str, bool]]:
    """(file:line, text, in a code block) of a page's code: its blocks' lines and its inline code spans."""
    found, in_block = [], False
    for number, line in enumerate(page.read_text().splitlines(), start=1):
        source = f"{page.relative_to(PROJECT_ROOT)}:{number}"
        if line.lstrip().startswith("```"):
            in_block = not in_block
        elif in_block:
            found.append((source, line, True))
        else:
            found += [(source, span, False) for span in re.findall(r"`([^`]+)`", line)]
    return found


def documented_commands() -> list[DocCommand]:
    pages = [*documentation_pages(), PROJECT_ROOT / "experiments/README.md"]
    spans = [span for page in pages for span in _spans(page)]
    for path in sorted((PROJECT_ROOT / "experiments").glob("*.yaml")):
        header = [line for line in path.read_text().splitlines() if line.startswith("#")]
        spans += [
            (f"{path.relative_to(PROJECT_ROOT)}", span, False)
            for line in header
            for span in re.findall(r"`([^`]+)`", line)
        ]
    unique: dict[str, DocCommand] = {}
    for source, text, in_block in spans:
        command = parse(text, source)
        if command is not None and (in_block or is_command(command)):
            unique.setdefault(command.text, command)
    return list(unique.values())


COMMANDS = documented_commands()


def _param(command: DocCommand):
    marks = [pytest.mark.heavy]  # about 10 s each; the subcommands are tested in-process in the default set
    marks += [pytest.mark.skip(reason=why) for pattern, why in SKIPPED.items() if re.search(pattern, command.text)]
    marks += [getattr(pytest.mark, marker) for pattern, (marker, _) in LONG.items() if re.search(pattern, command.text)]
    return pytest.param(command, marks=marks, id=f"{command.source} {command.text}"[:150])


# -- the user's folder -----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Store:
    folder: Path
    before: str  # a sweep's folder, relative to `folder`
    after: str
    run_dir: str  # a job's folder of `after`
    uri: str
    experiment: str  # the experiment of `before`
    parent: str  # the MLflow parent run of `before`
    after_parent: str
    run_id: str  # a job's MLflow run in `after`


@pytest.fixture(scope="module")
def user(tmp_path_factory: pytest.TempPathFactory) -> Store:
    """A checkout's root as a user of the docs has it, with two small sweeps of the same work made apart."""
    folder = tmp_path_factory.mktemp("user")
    (folder / ".venv").symlink_to(Path(sys.prefix))
    for name in ("src", "conf", "run.py"):
        (folder / name).symlink_to(PROJECT_ROOT / name)
    for name in ("experiments", "benchmarks", "scripts"):
        shutil.copytree(PROJECT_ROOT / name, folder / name, ignore=shutil.ignore_patterns("__pycache__"))
    job = ["model=llama", "task=generate", "backend=numpy", "model.prompt_len=4,8,16", "task.new_tokens=2"]
    parents = []
    for sweep, experiment in ((BEFORE, "tensor-runner"), (AFTER, "nightly")):
        overrides = [f"tracking.uri=sqlite:///{folder}/outputs/mlflow.db", f"tracking.experiment={experiment}"]
        made = subprocess.run(
            [sys.executable, str(PROJECT_ROOT / "run.py"), "-m", *job, *FAST_TIMING, *overrides,
             f"hydra.sweep.dir={folder / sweep}"],  # fmt: skip
            cwd=folder, capture_output=True, text=True, timeout=900,
        )  # fmt: skip
        assert made.returncode == 0, made.stderr[-3000:]
        parents.append(json.loads((folder / sweep / "sweep.json").read_text())["parent_run_id"])
    tracking = json.loads((folder / AFTER / "0" / "tracking.json").read_text())
    return Store(folder, BEFORE, AFTER, f"{AFTER}/0", STORE_URI, "tensor-runner", parents[0], parents[1],
                 tracking["run_id"])  # fmt: skip


def filled(command: DocCommand, store: Store) -> str:
    """The command with its placeholders filled from the user's folder."""
    words = []
    for word in command.words:
        key = word.removesuffix("...")  # RUN_DIR...: one or more
        if key in PLACEHOLDERS:
            words.append(PLACEHOLDERS[key].format(**vars(store)))
        elif PLACEHOLDER.search(key) and not re.fullmatch(r"[A-Z_]+=.*|-.*", key):
            pytest.fail(f"{command.source}: {command.text}: teach PLACEHOLDERS what {key} stands for")
        else:
            words.append(word)
    return _shell(tuple(words))


# -- the test --------------------------------------------------------------------------------------------------------


def test_the_docs_print_scripts_and_runner_commands():
    """The collector finds the forms the docs use, and the commands issue 74 names."""
    texts = {command.text for command in COMMANDS}
    assert {".venv/bin/python experiments/summarize.py SWEEP_DIR", ".venv/bin/runner --help"} <= texts
    assert any(t.startswith(".venv/bin/runner history --experiment nightly") for t in texts)  # a CI step's
    assert ".venv/bin/python scripts/uv_args.py" in texts  # inside $( ... )
    assert not is_command(parse("runner sync", "x:1")) and is_command(parse("runner sync RUN_DIR", "x:1"))
    assert not is_command(parse("runner history outputs/multirun/2026-11-25/09-12-40 ...", "x:2"))
    assert parse("python run.py -m backend=numpy", "x:3") is None and parse("python -m runner run", "x:4") is None
    assert _shell(parse('- run: runner history --tracking-uri "$STORE" > comment.md', "x:5").words) == (
        'runner history --tracking-uri "$STORE" > comment.md'
    )


@pytest.mark.parametrize("command", [_param(c) for c in COMMANDS])
def test_documented_command_runs_as_printed(command: DocCommand, user: Store):
    line = filled(command, user)
    env = {
        **os.environ,
        "PATH": f"{Path(sys.prefix) / 'bin'}{os.pathsep}{os.environ['PATH']}",  # `python`, `runner`: the venv's
        "MLFLOW_TRACKING_URI": STORE_URI,
        "STORE": STORE_URI,
    }
    limit = 5400 if any(re.search(pattern, command.text) for pattern in LONG) else 1800  # a safety net, no measure
    done = subprocess.run(["bash", "-c", line], cwd=user.folder, env=env, capture_output=True, text=True, timeout=limit)
    said = f"{command.source}: {command.text}\n$ {line}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    assert done.returncode == 0, said
    words = shlex.split(line)
    for option, path in zip(words, words[1:], strict=False):
        if option in ("--out", "--html", ">"):
            written = user.folder / path
            assert written.exists() and (written.is_file() and written.stat().st_size or any(written.iterdir())), said
    if "--json" in words and ">" not in words:
        json.loads(done.stdout)
    for pattern, (path, unsaid) in WRITES.items():
        if re.search(pattern, command.text):
            assert unsaid not in (user.folder / path).read_text(), f"{said}\n{(user.folder / path).read_text()}"

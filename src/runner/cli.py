"""`runner` (also `python -m runner`): run experiments, report on runs, upload runs that could not reach their store.

runner run [OVERRIDES]   the same as `python run.py [OVERRIDES]` and `tensor-runner [OVERRIDES]` (runner.app)
runner report --tracking-uri URI --experiment NAME --out DIR [--parent RUN_ID]
runner report --sweep-dir DIR --out DIR
runner compare BEFORE AFTER [--tracking-uri URI] [--factor 1.1]
runner sync RUN_DIR... [--tracking-uri URI]
runner history [DIR...] [--tracking-uri URI] [--experiment NAME] [--case KEY] [--by-host] [--json | --markdown]
               [--html DIR] [--fdr 0.05] [--series NAMES] [--fail-on LABELS [--new-within N] [--confirm]]
runner history --mark RUN_ID --why TEXT
runner bisect GOOD BAD [--find-links DIR] [--threshold 0.02] [--out DIR] -- OVERRIDES...
runner --version
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from runner import version
from runner.errors import ConfigError
from runner.record.sweep_file import read_sweep_file

if TYPE_CHECKING:  # imported where used: `runner run` (its --help above all) and `runner --version` need none of it
    pass


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["run"]:  # Hydra's own command line follows: its overrides, -m, --help, --cfg ...
        from runner.app import cli

        cli(argv[1:])
        return 0
    overrides = argv[argv.index("--") + 1 :] if argv[:1] == ["bisect"] and "--" in argv else []
    args = _parser().parse_args(argv[: len(argv) - len(overrides) - 1] if overrides else argv)  # argparse's -- mixes
    if overrides:  # with subcommands: run.py's overrides after it, taken whole
        args.overrides = [*args.overrides, *overrides]
    from runner.record.result import ResultUnreadable

    try:
        return args.command(args)
    except (LookupError, FileNotFoundError, ConnectionError, ConfigError, ResultUnreadable) as error:
        print(f"error: {error}", file=sys.stderr)  # what cannot be read or is refused: exit 2, as argparse's own
        return 2  # refusals and run.py's, so that a gate's 1 (runner history --fail-on) is only what it found
    except KeyboardInterrupt:  # Ctrl-C: what was written stays (a re-run closes its own runs), and no traceback
        print("interrupted", file=sys.stderr)
        return 130


def _path(text: str) -> Path:
    """A path option's value: an empty one is a slip (Path('') would be the current folder), refused by argparse."""
    if not text.strip():
        raise argparse.ArgumentTypeError("an empty path: give a file or folder")
    return Path(text)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="runner", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"tensor-runner {version()}")
    commands = parser.add_subparsers(required=True, metavar="COMMAND")
    commands.add_parser("run", help="run an experiment: runner run [OVERRIDES] (python run.py's, see run --help)")

    report = commands.add_parser("report", help="CSV, markdown and PNG plots comparing runs")
    source = report.add_mutually_exclusive_group(required=True)
    source.add_argument("--experiment", help="MLflow experiment name (with --tracking-uri)")
    source.add_argument("--sweep-dir", type=_path, help="a sweep directory (reads its result.json files)")
    uri_help = "MLflow tracking URI, e.g. sqlite:///outputs/mlflow.db (default: MLFLOW_TRACKING_URI)"
    report.add_argument("--tracking-uri", help=uri_help)
    report.add_argument("--parent", help="only the children of this sweep parent run (and log the report to it)")
    report.add_argument("--out", type=_path, required=True, help="directory for runs.csv, runs.md and *.png")
    report.set_defaults(command=_report)

    compare = commands.add_parser("compare", help="the same work measured apart: after / before, with a verdict")
    for side in ("before", "after"):
        compare.add_argument(side, help="a run or sweep directory, or an MLflow run id (a sweep's parent: its jobs)")
    compare.add_argument("--tracking-uri", help=uri_help)
    compare.add_argument("--factor", type=float, default=1.1, help="smallest change called one (default 1.1)")
    compare.set_defaults(command=_compare)

    _history_parser(commands, uri_help)

    bisect = commands.add_parser("bisect", help="the first release (or commit) of a package that made a job slower")
    bisect.add_argument("good", help="a release not slower (pkg==X), or a commit: 'pkg @ git+file:///repo@SHA'")
    bisect.add_argument("bad", help="a later release (or commit) that is slower")
    bisect.add_argument("overrides", nargs="*", metavar="OVERRIDES", help="after --: the job, as run.py takes it")
    bisect.add_argument("--find-links", type=_path, help="a folder of wheels beside the indexes pip is configured with")
    bisect.add_argument("--threshold", type=float, default=0.02, help="smallest slowdown called one (default 0.02)")
    bisect.add_argument("--out", type=_path, help="folder of the probes' sweeps (default outputs/bisect/DATE/TIME)")
    bisect.set_defaults(command=_bisect)

    sync = commands.add_parser("sync", help="upload runs (or whole sweeps) kept locally to MLflow")
    sync.add_argument("run_dirs", nargs="+", type=_path, metavar="RUN_DIR")
    sync.add_argument("--tracking-uri", help="upload here instead of the URI the run was made with")
    sync.set_defaults(command=_sync)
    return parser


def _history_parser(commands, uri_help: str) -> None:
    history = commands.add_parser("history", help="each case's runs over time on one kind of machine, and its steps")
    history.add_argument("dirs", nargs="*", type=_path, metavar="DIR", help="run or sweep directories (else MLflow)")
    history.add_argument("--tracking-uri", help=uri_help)
    history.add_argument("--experiment", help="only this MLflow experiment (default: every one)")
    history.add_argument("--case", help="only this case (a run's `case` tag)")
    history.add_argument("--machine", help="only this kind of machine (a run's `machine` tag)")
    history.add_argument(
        "--by-host",
        action="store_true",
        help="a series per host too (the machine is its kind: hosts of one kind share one)",
    )
    output = history.add_mutually_exclusive_group()
    output.add_argument("--json", action="store_true", help="print the histories as JSON, for other tools")
    output.add_argument(
        "--markdown", action="store_true", help="print a summary for a pull request's comment (GitHub markdown)"
    )
    history.add_argument("--html", type=_path, metavar="DIR", help="write a page per case and an index.html here")
    history.add_argument(
        "--fail-on",
        default="",
        metavar="LABELS",
        help="exit 1 on a step so labelled (regression,...), or on a case "
        "whose newest runs failed (failure) or that stopped appearing (missing)",
    )
    history.add_argument(
        "--series",
        metavar="NAMES",
        help="only these series (e.g. first_call_s,time_typical_s; default: every one): what prints and what "
        "--fail-on gates",
    )
    history.add_argument("--missing-after", type=int, default=3, metavar="N", help="a case absent from its machine's "
                         "newest N sweeps is missing (default 3)")  # fmt: skip
    history.add_argument(
        "--new-within",
        type=int,
        metavar="N",
        help="with --fail-on: only steps that start among each series' newest N runs (a nightly gate: 3)",
    )
    history.add_argument(
        "--confirm",
        action="store_true",
        help="with --fail-on: run each flagged case again first; exit 1 only on the steps its re-run confirms",
    )
    history.add_argument(
        "--fdr",
        type=float,
        default=0.05,
        metavar="Q",
        help="the false-discovery rate a store's steps are held to together (default 0.05): above it, no alert",
    )
    history.add_argument(
        "--record",
        action="store_true",
        help="write to the store what was found: each case's newest run tagged history.verdict, and with --html its "
        "page and plot as that run's artifacts (else the store is only read)",
    )
    history.add_argument("--mark", metavar="RUN_ID", help="mark a known change at this run (no alert there) and exit")
    history.add_argument("--why", help="what changed, with --mark (e.g. 'new machine'; default: known change)")
    history.set_defaults(command=_history)


def _history(args: argparse.Namespace) -> int:
    import tempfile

    from runner import tracking
    from runner.history import as_json, describe, gate, markdown, narrow, page, profiles, store

    uri = args.tracking_uri or os.environ.get("MLFLOW_TRACKING_URI")
    if args.mark:
        print(store.mark(uri, args.mark, args.why))
        return 0
    labels, series = _history_checked(args), narrow.chosen(args.series)
    if args.html:
        writable_folder(args.html, "--html")
    uri = "" if args.dirs else uri or _project_store()
    query = store.Query(args.experiment, args.case, args.machine, args.by_host, args.fdr, args.missing_after)
    found, gapped = store.histories(uri, args.dirs, query)
    if args.record and uri:
        store.record(uri, found)
    found = narrow.narrowed(found, series)
    gated, confirmed = gate.recent(found, args.new_within), None
    if args.confirm and args.markdown:  # the re-runs first, so that the comment says what they found
        confirmed = gate.confirmed_steps(uri, gated, labels)
        for line in confirmed.lines:
            print(line, file=sys.stderr)
    if args.json:
        print(as_json.to_json(found, gapped))
    elif args.markdown:
        print(markdown.comment(found, args.fdr, labels, args.confirm, args.new_within))
        print("".join(f"\n- {markdown.cell(g.line())}" for g in gapped))
    else:
        print("\n".join([*describe.lines(found, args.fdr), *(g.line() for g in gapped)]))
    aside = sys.stderr if args.json or args.markdown else sys.stdout
    if args.html:
        ui = tracking.ui_base(uri) if uri else None
        with tempfile.TemporaryDirectory() as logged:  # the pages as --record logs them, for MLflow's viewer
            viewer = Path(logged) if args.record and uri else None
            print(f"wrote {page.write(found, args.html, ui, gapped, profiles.reader(uri), viewer)}", file=aside)
            if viewer is not None:
                print(store.log_pages(uri, found, viewer), file=aside)
    judged = gate.judged(uri, gated, gapped, labels, args.confirm, confirmed)
    for line in judged.lines:
        print(line, file=sys.stderr)
    return judged.status


def _history_checked(args: argparse.Namespace) -> set[str]:
    """The options that go together, checked before anything is read: --fail-on's labels."""
    from runner.history import gate

    if args.why is not None:
        raise LookupError("--why says what changed at the run --mark names: give --mark RUN_ID too")
    if not 0 < args.fdr < 1:
        raise LookupError(f"--fdr must be in (0, 1), not {args.fdr:g}: the share of alerts allowed to be false (0.05)")
    labels = gate.fail_labels(args.fail_on)
    if args.new_within is not None and args.new_within < 1:
        raise LookupError(f"--new-within must be a number of runs, 1 or more, not {args.new_within}")
    if args.experiment and args.dirs:
        raise LookupError("--experiment names an MLflow experiment; runs read from a DIR have none: give either")
    if args.confirm and (not labels or args.dirs):
        raise LookupError("--confirm runs the cases --fail-on flags again into MLflow: give --fail-on LABELS, no DIR")
    return labels


def writable_folder(path: Path, option: str) -> None:
    """Where a command writes its files: a folder, or a place one can be made (checked before anything prints), by
    run.py's own check of an output folder (a read-only place, a name too long, a file on the way, a full disk)."""
    from runner.launch.where_it_runs import folder_problem

    problem = folder_problem(option, str(path))
    if problem:
        raise LookupError(problem)


def _project_store() -> str:
    """The store run.py writes to by default (outputs/mlflow.db), where neither --tracking-uri nor
    MLFLOW_TRACKING_URI names one; said in one line on stderr, so that --json stays parseable."""
    from runner.locations import output_root

    path = output_root() / "outputs" / "mlflow.db"
    if not path.is_file():
        raise LookupError(
            f"no store at {path}, where run.py records by default: give run or sweep folders, or --tracking-uri"
        )
    print(
        f"runs of {path} (run.py's default store; --tracking-uri or MLFLOW_TRACKING_URI for another)", file=sys.stderr
    )
    return f"sqlite:///{path}"


def _report(args: argparse.Namespace) -> int:
    from runner import report, tracking
    from runner.record import runs

    writable_folder(args.out, "--out")
    if args.sweep_dir is not None:
        if not args.sweep_dir.is_dir():
            raise FileNotFoundError(f"{args.sweep_dir} is not a directory")
        parent, uri = _sweeps_parent(args, read_sweep_file(args.sweep_dir))
        frame = report.frame(runs.from_dirs(runs.runs_in(args.sweep_dir)))
    else:
        parent, uri = args.parent, args.tracking_uri or os.environ.get("MLFLOW_TRACKING_URI")
        if not uri:
            raise LookupError("--experiment needs --tracking-uri (or MLFLOW_TRACKING_URI)")
        if parent:
            tracking.existing_run(uri, parent)  # the report is logged to it: refused before anything is written
        frame = report.frame(tracking.search_runs(uri, args.experiment, parent))
    files = report.write_report(frame, args.out)
    for path in files:
        print(path)
    if parent and uri:
        report.log_to_parent(uri, parent, files)
        print(f"logged to the parent run {parent}")
    return 0


def _sweeps_parent(args: argparse.Namespace, info: dict) -> tuple[str | None, str | None]:
    """Where a sweep's report is logged: the --parent given (refused where its store lacks it), else the parent run its
    sweep.json names where its store still holds it (a store moved or gone is a warning: the report is written)."""
    from runner import tracking

    parent, uri = args.parent or info.get("parent_run_id"), args.tracking_uri or info.get("uri")
    if not (parent and uri):
        return None, None
    try:
        tracking.existing_run(uri, parent)
    except (LookupError, ConnectionError) as error:
        if args.parent:
            raise
        print(f"warning: the report is not logged to the sweep's parent run: {error}", file=sys.stderr)
        return None, None
    return parent, uri


def _compare(args: argparse.Namespace) -> int:
    from runner.report import before_after

    if not 1.0 <= args.factor < float("inf"):
        raise LookupError(f"--factor {args.factor}: it must be a number from 1 up (1.1 = a change of 10%)")
    uri = args.tracking_uri or os.environ.get("MLFLOW_TRACKING_URI")
    for line in before_after.run(args.before, args.after, uri, args.factor):
        print(line)
    return 0


def _bisect(args: argparse.Namespace) -> int:
    from runner.launch import bisect

    return bisect.run(args.good, args.bad, args.overrides, args.find_links, args.threshold, args.out)


def _sync(args: argparse.Namespace) -> int:
    from runner import tracking
    from runner.launch.sweep.sync import sync_path

    failures = 0
    for path in args.run_dirs:
        for synced in sync_path(path, args.tracking_uri):
            failed = synced.state == tracking.SyncState.FAILED
            failures += failed
            print(synced.line(), file=sys.stderr if failed else sys.stdout)
    return 1 if failures else 0

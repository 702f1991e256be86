"""`runner bisect GOOD BAD [--find-links DIR] [--threshold T] -- OVERRIDES`: the first release (or commit) of a
package that made a job slower, by binary search, each probe one sweep that times two Python environments in the same
interleaved rounds (environment.with, runner.launch.environments).

GOOD and BAD name one package: two releases ('numpy==2.3.0') or two commits of a git repository
('mypkg @ git+file:///repo@SHA'). The candidates are the releases the indexes and find-links offer between them (pip's
own list, as set-up installs from), or the commits between them (`git rev-list`). The first probe times GOOD against
BAD: where BAD is not slower, there is nothing to find (exit 1). Then each probe times the last release known not to
be slower against the middle of what is left, and the answer is the first slower release against the one before it,
probed side by side: at most ceil(log2 N) + 2 probes (a probe whose rounds disagree, on a busy machine, is timed
once more before it decides).
"""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from runner.errors import ConfigError
from runner.locations import FROM_CHECKOUT, PROJECT_ROOT

GIT_URL = re.compile(r"^(?P<name>[\w.-]+)\s*@\s*git\+(?P<url>file://[^@\s]+)@(?P<commit>[0-9a-fA-F]{4,40})$")
EXIT_FOUND, EXIT_NONE, EXIT_BAD_INPUT = 0, 1, 2


@dataclass(frozen=True)
class Candidate:
    """One release or commit of the package: `requirement` installs it, `name` says it ('2.3.0', '1a2b3c4d5e6f')."""

    requirement: str
    name: str


@dataclass(frozen=True)
class Probe:
    """One same-round A/B: `after`'s typical time over `before`'s, with its 95% interval and whether it is slower."""

    before: Candidate
    after: Candidate
    ratio: float
    low: float
    high: float
    slower: bool
    sweep_dir: Path

    @property
    def resolved(self) -> bool:
        """Whether the probe has an interval (a busy machine may leave a configuration's rounds in disagreement)."""
        return not math.isnan(self.low)

    def said(self, package: str) -> str:
        """'plantpkg 1.3 → 1.4: 1.05x [1.03–1.07] slower'."""
        word = "slower" if self.slower else "not slower" if self.resolved else "cannot tell (no interval)"
        return f"{package} {self.before.name} → {self.after.name}: {_ratio_text(self)} {word}"


def candidates(good: str, bad: str, find_links: Path | None) -> tuple[str, list[Candidate]]:
    """The package and its candidates from GOOD to BAD, both included, in order; ConfigError for bounds that name two
    packages, come in the wrong order, or that the indexes do not offer."""
    good_git, bad_git = GIT_URL.match(good.strip()), GIT_URL.match(bad.strip())
    if good_git and bad_git:
        return _commits(good_git, bad_git)
    if good_git or bad_git:
        raise ConfigError("runner bisect: GOOD and BAD must both be releases (pkg==X) or both commits (pkg @ git+...)")
    return _releases(good, bad, find_links)


def _releases(good: str, bad: str, find_links: Path | None) -> tuple[str, list[Candidate]]:
    from packaging.requirements import InvalidRequirement, Requirement
    from packaging.utils import canonicalize_name
    from packaging.version import Version

    try:
        first, last = Requirement(good), Requirement(bad)
    except InvalidRequirement as error:
        raise ConfigError(f"runner bisect: {error}") from None
    if canonicalize_name(first.name) != canonicalize_name(last.name):
        raise ConfigError(f"runner bisect: GOOD and BAD name two packages ({first.name}, {last.name})")
    bounds = [_pinned(r) for r in (first, last)]
    if bounds[0] >= bounds[1]:
        raise ConfigError(f"runner bisect: GOOD ({bounds[0]}) must be an earlier release than BAD ({bounds[1]})")
    offered = _offered(first.name, find_links)
    for bound in bounds:
        if bound not in offered:
            raise ConfigError(f"runner bisect: {first.name}=={bound} is not offered by the indexes or find-links")
    between = sorted(v for v in offered if bounds[0] <= v <= bounds[1] and (not v.is_prerelease or v in bounds))
    return first.name, [Candidate(f"{first.name}=={v}", str(v)) for v in between if isinstance(v, Version)]


def _pinned(requirement):
    from packaging.version import Version

    specifiers = list(requirement.specifier)
    if len(specifiers) != 1 or specifiers[0].operator != "==" or "*" in specifiers[0].version:
        raise ConfigError(f"runner bisect: {requirement} must name one release (pkg==X)")
    return Version(specifiers[0].version)


def _offered(package: str, find_links: Path | None) -> set:
    """The releases of `package` the indexes and find-links pip is configured with offer (`pip index versions`),
    and those in `find_links`."""
    from packaging.version import InvalidVersion, Version

    command = [sys.executable, "-m", "pip", "index", "versions", package, "--pre"]
    listed = subprocess.run([*command, *(["--find-links", str(find_links)] if find_links else [])],
                            capture_output=True, text=True, timeout=300, check=False)  # fmt: skip
    line = next((x for x in listed.stdout.splitlines() if x.startswith("Available versions:")), "")
    found = set()
    for text in line.removeprefix("Available versions:").split(","):
        try:
            found.add(Version(text.strip()))
        except InvalidVersion:
            continue
    return found


def _commits(good: re.Match, bad: re.Match) -> tuple[str, list[Candidate]]:
    """The commits from GOOD to BAD along BAD's history (git rev-list --ancestry-path), both included."""
    if good["name"] != bad["name"] or good["url"] != bad["url"]:
        raise ConfigError("runner bisect: GOOD and BAD must name one package in one repository")
    repo = good["url"].removeprefix("file://")
    between = f"{good['commit']}..{bad['commit']}"
    command = ["git", "-C", repo, "rev-list", "--reverse", "--ancestry-path", between]
    listed = subprocess.run(command, capture_output=True, text=True, check=False)
    if listed.returncode != 0:
        said = (listed.stderr.strip().splitlines() or ["failed"])[-1]
        raise ConfigError(f"runner bisect: git rev-list {between} in {repo}: {said}")
    commits = listed.stdout.split()
    if not commits:
        raise ConfigError(f"runner bisect: {good['commit']} (GOOD) is not an earlier commit of BAD's history")
    first = _full_commit(repo, good["commit"])
    return good["name"], [Candidate(f"{good['name']} @ git+{good['url']}@{c}", c[:12]) for c in [first, *commits]]


def _full_commit(repo: str, commit: str) -> str:
    found = subprocess.run(["git", "-C", repo, "rev-parse", "--verify", f"{commit}^{{commit}}"],
                           capture_output=True, text=True, check=False)  # fmt: skip
    if found.returncode != 0:
        raise ConfigError(f"runner bisect: {commit} is no commit of {repo}")
    return found.stdout.strip()


# -- probing -------------------------------------------------------------------------------------------------------


def probe(package: str, pair: tuple[Candidate, Candidate], overrides: list[str], find_links: Path | None,
          threshold: float, folder: Path) -> Probe:  # fmt: skip
    """One sweep timing `before` and `after` in the same rounds (run.py -m ... environment.with=...), its rounds run
    until the comparison resolves half the threshold (timing.resolve, unless the overrides set it) or the budget ends;
    `after` is slower where its interval lies above 1 and its ratio reaches 1 + threshold."""
    before, after = pair
    sweep_dir = folder / f"probe-{len(list(folder.glob('probe-*'))) + 1}"
    asked = f"environment.with={_quoted(before.requirement)},{_quoted(after.requirement)}"
    links = [f"environment.find_links={find_links}"] if find_links else []
    resolve = [] if any(o.startswith("timing.resolve=") for o in overrides) else [f"timing.resolve={threshold / 2:g}"]
    command = [*_run_command(), "-m", *resolve, *overrides, asked, *links, f"hydra.sweep.dir={sweep_dir}"]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode == 2:  # refused: bad overrides or an environment that cannot be built
        raise ConfigError(done.stderr.strip().splitlines()[-1].removeprefix("error: "))
    ratio, low, high = _ratio(sweep_dir, package, before, after)
    slower = not math.isnan(low) and low > 1 and ratio >= 1 + threshold
    return Probe(before, after, ratio, low, high, slower, sweep_dir)


def _run_command() -> list[str]:
    """run.py from a checkout, the installed app (python -m runner run) otherwise."""
    return [sys.executable, str(PROJECT_ROOT / "run.py")] if FROM_CHECKOUT else [sys.executable, "-m", "runner", "run"]


def _quoted(requirement: str) -> str:
    return "'" + requirement.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _ratio(sweep_dir: Path, package: str, before: Candidate, after: Candidate) -> tuple[float, float, float]:
    """`after`'s time over `before`'s, with its interval, from the sweep's answer (each against the fastest)."""
    from runner.record import runs
    from runner.report import frame
    from runner.report.pooled import pool

    pooled = pool(frame(runs.from_dirs(runs.runs_in(sweep_dir))))
    found = {_side(p.versions, package, (before, after)): p for p in pooled}
    if set(found) != {before.name, after.name}:
        raise ConfigError(f"runner bisect: the probe in {sweep_dir} did not time both (see its jobs' job.log)")
    timed = found[after.name]
    if timed.is_fastest:  # the other is the slower one: invert its ratio and interval
        other = found[before.name]
        return 1 / other.ratio, 1 / other.high, 1 / other.low
    return timed.ratio, timed.low, timed.high


def _side(versions: str, package: str, sides: tuple[Candidate, Candidate]) -> str:
    """Which candidate a configuration's resolved set ('name==version ...', Pooled.versions) holds ('' where none)."""
    from packaging.utils import canonicalize_name

    resolved = dict(item.split("==", 1) for item in versions.split() if "==" in item)
    version = resolved.get(canonicalize_name(package), "")
    return next((side.name for side in sides if _same_release(version, side.name)), "")


def _same_release(resolved: str, asked: str) -> bool:
    """'2.13.0+cpu' is the release '2.13.0' asked for; a commit is itself."""
    from packaging.version import InvalidVersion, Version

    try:
        return Version(resolved).public == Version(asked).public
    except InvalidVersion:
        return resolved == asked


def _ratio_text(found: Probe) -> str:
    from runner.record.table import format_interval, format_ratio

    interval = format_interval((found.low, found.high))
    return f"{format_ratio(found.ratio)} [{interval[:-1]}]" if interval else format_ratio(found.ratio)


def search(
    package: str,
    found: list[Candidate],
    overrides: list[str],
    find_links: Path | None,
    threshold: float,
    folder: Path,
    say=print,
) -> tuple[Probe | None, list[Probe]]:
    """The first slower candidate's probe (None where BAD is not slower than GOOD), and every probe made, each a
    sweep in `folder` (probe-1, probe-2, ...)."""
    made: list[Probe] = []

    def measure(before: Candidate, after: Candidate) -> Probe:
        say(f"probe {len({(p.before, p.after) for p in made}) + 1}: timing {package} {before.name} and {after.name} "
            "in the same rounds")  # fmt: skip
        result = probe(package, (before, after), overrides, find_links, threshold, folder)
        number = len({(p.before, p.after) for p in made}) + 1
        if not result.resolved:  # its rounds disagreed (a busy machine): timed once more before it decides
            made.append(result)
            say(f"probe {number}: {result.said(package)}; timing it again")
            result = probe(package, (before, after), overrides, find_links, threshold, folder)
        made.append(result)
        say(f"probe {number}: {result.said(package)}")
        return result

    ends = measure(found[0], found[-1])
    if not ends.slower:
        return None, made
    low, high, last = 0, len(found) - 1, ends
    while high - low > 1:
        middle = (low + high) // 2
        result = measure(found[low], found[middle])
        if result.slower:
            high, last = middle, result
        else:
            low = middle
    if last.before != found[low] or last.after != found[high]:
        step = measure(found[low], found[high])  # the step itself, side by side with the release before it
        last = step if step.resolved else last  # where it cannot tell: the search's own evidence, against its base
    return last, made


def report(package: str, first: Probe | None, found: list[Candidate], threshold: float) -> str:
    """The last line: 'first slower: PKG VERSION (RATIO [INTERVAL] against PREVIOUS)'."""
    if first is None:
        return f"no release of {package} from {found[0].name} to {found[-1].name} is slower by {threshold:.0%} or more"
    if not first.slower:  # the step's own probe did not repeat what the search saw
        return f"no single step found: {package} {first.after.name} against {first.before.name} is not slower"
    return f"first slower: {package} {first.after.name} ({_ratio_text(first)} against {first.before.name})"


def record(made: list[Probe], first: Probe | None, line: str) -> None:
    """Each probe's MLflow parent run (where its sweep was tracked) under one parent run of the bisection."""
    tracked = [p for p in made if _sweep_info(p).get("parent_run_id")]
    if not tracked:
        return
    from runner import tracking

    info = _sweep_info(tracked[0])
    mlflow = tracking.client(info["uri"])
    experiment_id = tracking.ensure_experiment(mlflow, info["uri"], info["experiment"])
    tags = {"mlflow.runName": f"bisect {made[0].before.requirement} .. {made[0].after.requirement}"[:250],
            "mlflow.note.content": line, "verdict": line}  # fmt: skip
    parent = tracking.retry_on_lock(mlflow.create_run, experiment_id, tags=tags).info.run_id
    for found in tracked:
        tracking.retry_on_lock(mlflow.set_tag, _sweep_info(found)["parent_run_id"], "mlflow.parentRunId", parent)
    status = "FINISHED" if first is not None and first.slower else "FAILED"
    tracking.retry_on_lock(mlflow.set_terminated, parent, status)


def _sweep_info(found: Probe) -> dict:
    path = found.sweep_dir / "sweep.json"
    return json.loads(path.read_text()) if path.is_file() else {}


def _check_job(overrides: list[str]) -> None:
    """The job's overrides checked as run.py checks a sweep's (runner.launch.preflight), before a candidate is listed
    or a probe started: a mistyped one is one line, with nothing said or made before it."""
    from runner.launch import preflight

    try:
        preflight.check(["-m", *overrides])
    except preflight.BadInput as error:
        raise ConfigError(f"runner bisect: {error}") from None


def run(good: str, bad: str, overrides: list[str], find_links: Path | None, threshold: float, out: Path | None) -> int:
    """`runner bisect`: each probe's verdict, then the answer; its exit status (EXIT_FOUND, EXIT_NONE,
    EXIT_BAD_INPUT, with one line on stderr)."""
    from runner.locations import output_root

    try:
        if find_links is not None and not find_links.is_dir():
            raise ConfigError(f"runner bisect: --find-links {find_links}: no such folder")
        if not 0 <= threshold < 10:
            raise ConfigError(f"runner bisect: --threshold {threshold}: must be a fraction from 0 (e.g. 0.02: 2%)")
        _check_job(overrides)
        package, found = candidates(good, bad, find_links)
        folder = out or output_root() / "outputs" / "bisect" / time.strftime("%Y-%m-%d/%H-%M-%S")
        print(f"bisect {package}: {len(found)} candidates from {found[0].name} to {found[-1].name}, sweeps in {folder}")
        first, made = search(package, found, overrides, find_links, threshold, folder)
    except ConfigError as error:
        print(f"error: {error}", file=sys.stderr)
        return EXIT_BAD_INPUT
    line = report(package, first, found, threshold)
    print(line)
    record(made, first, line)
    return EXIT_FOUND if first is not None and first.slower else EXIT_NONE

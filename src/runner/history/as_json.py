"""`runner history --json`: per case and machine its names, its runs (each with its host where they ran on several),
what its times were fitted on and each sweep whose control gave no time (control_notes), the steps found in its
times, its numbers and its figures, every series fitted (by name), and its gaps (a case whose newest runs failed, or
that stopped appearing); strict JSON, a number that is not one (an interval a run lacks) as null."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import asdict
from datetime import UTC, datetime

from runner.history.describe import control_notes
from runner.history.figures import FIGURES
from runner.history.gaps import Gapped
from runner.history.narrow import TIMES, series_names, times_read
from runner.history.series import History
from runner.history.steps import Step


def to_json(histories: list[History], gapped: Sequence[Gapped] = ()) -> str:
    """The histories (and `gapped`, each under its case's "gaps"; a case with gaps only, one with no runs)."""
    cases = [_case(h) for h in histories]
    by_key = {(c["case"], c["machine"]): c for c in cases}
    for g in gapped:
        case = by_key.get((g.case, g.machine))
        if case is None:
            case = {"case": g.case, "case_name": g.case_name, "machine": g.machine, "machine_name": g.machine_name,
                    "runs": [], "steps": [], "gaps": []}  # fmt: skip
            by_key[(g.case, g.machine)] = case
            cases.append(case)
        case["gaps"].append({**asdict(g), "gap": str(g.gap), "line": g.line()})
    return json.dumps(_strict(cases), indent=1, allow_nan=False)


def _case(h: History) -> dict:
    return {
        "case": h.case,
        "case_name": h.case_name,
        "machine": h.machine,
        "machine_name": h.machine_name,
        "runs": _runs(h),
        "fitted": f"relative to {h.control_name}" if h.relative else "times",
        "control_notes": control_notes(h),  # each sweep whose control gave no time, and what was fitted instead
        "steps": [step_record(h, s) for s in h.steps],
        "raw_steps": [step_record(h, s) for s in h.raw_steps],
        "numeric_steps": [{"metric": name, **step_record(h, s)} for name, steps in h.numbers.items() for s in steps],
        "figure_steps": [{"metric": name, **step_record(h, s)} for name, steps in h.figures.items() for s in steps],
        "series": _series(h),
        "gaps": [],
    }


def _runs(h: History) -> list[dict]:
    """Its runs, each with its `host` where the case's runs ran on several (History.several_hosts)."""
    shown = h.several_hosts()
    return [{k: v for k, v in asdict(e).items() if k != "host" or shown} for e in h.entries]


def _series(h: History) -> list[dict]:
    """Every series fitted (those --series named, where it narrowed them): its metric's name, what a line calls it,
    its direction and how many steps it has."""
    names, steps = series_names(), {TIMES: h.steps, **h.numbers, **h.figures}
    fitted = [*([TIMES] if times_read(h) else []), *h.numbers, *h.figures]
    return [
        {
            "name": name,
            "said": names[name],
            "higher_is_better": name in FIGURES and FIGURES[name].higher_is_better,
            "steps": len(steps[name]),
        }
        for name in fitted
    ]


def step_record(history: History, step: Step) -> dict:
    """A step for --json: the first run after it (id, start), after / before with its interval, its label."""
    first = history.entries[step.index]
    return {
        "run_id": first.run_id,
        "start_time": datetime.fromtimestamp(first.started, UTC).isoformat(),
        "index": step.index,
        "ratio": step.ratio,
        "low": step.low,
        "high": step.high,
        "label": str(step.label),
        "p_value": step.p_value,
        "q_value": step.q_value,
        "significant": step.significant,
    }


def _strict(value):
    """NaN and infinities as None, everywhere in a structure of lists and dicts, as strict JSON has no such number."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _strict(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_strict(v) for v in value]
    return value

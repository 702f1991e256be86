"""The first call taken apart where the framework reports its parts (runner.backends.first_call): a tiny real job on
each backend writes them into result.json, each above zero, the traced, lowered and compiled parts within the first
call and the first execution the rest of it; NumPy, which compiles nothing, records none of them (absent, not zero)."""

from __future__ import annotations

import json
import math

import pytest

from runner.backends.first_call import COMPILE_S, EXECUTE_S, GRAPHS, LOWER_S, PARTS_S, TRACE_S, Parts, figures
from runner.measure.job import run_and_record
from runner.record.naming import job_spec

FIGURES = (*PARTS_S, EXECUTE_S, GRAPHS)


def _recorded(make_config, tmp_path, *overrides: str) -> dict[str, float]:
    """The metrics of a tiny inference job as its result.json holds them."""
    cfg = make_config(*overrides, "model=mlp", "task=inference", "tracking=none", "isolation=inline")
    result = run_and_record(job_spec(cfg), tmp_path)
    assert result.status == "FINISHED", result.error
    return json.loads((tmp_path / "result.json").read_text())["metrics"]


def _assert_taken_apart(metrics: dict[str, float], parts: set[str]) -> None:
    assert {name for name in FIGURES if name in metrics} == parts | {EXECUTE_S, GRAPHS}
    assert all(metrics[name] > 0 for name in (*parts, EXECUTE_S, GRAPHS))
    spent = sum(metrics[name] for name in parts)
    assert spent <= metrics["first_call_s"]
    assert math.isclose(spent + metrics[EXECUTE_S], metrics["first_call_s"], rel_tol=1e-9)


def test_numpy_compiles_nothing_and_records_no_part(make_config, tmp_path):
    metrics = _recorded(make_config, tmp_path, "backend=numpy")
    assert metrics["first_call_s"] > 0
    assert not [name for name in metrics if name.startswith("first_call_") and name != "first_call_s"]


def test_jax_jit_records_its_trace_lowering_and_compile(make_config, tmp_path):
    metrics = _recorded(make_config, tmp_path, "backend=jax", "mode=function")
    _assert_taken_apart(metrics, {TRACE_S, LOWER_S, COMPILE_S})
    assert metrics[GRAPHS] == 1  # one program: the whole forward under jax.jit


def test_tf_function_records_its_tracing_and_one_trace(make_config, tmp_path):
    metrics = _recorded(make_config, tmp_path, "backend=tensorflow", "mode=function")
    _assert_taken_apart(metrics, {TRACE_S})  # graph optimisation happens in the first execution: not apart
    assert metrics[GRAPHS] == 1


@pytest.mark.heavy  # torch.compile's Inductor writes and builds C++: seconds, tens on a cold cache
def test_torch_compile_records_dynamo_and_the_backend_compile(make_config, tmp_path):
    metrics = _recorded(make_config, tmp_path, "backend=torch", "mode=function")
    _assert_taken_apart(metrics, {TRACE_S, COMPILE_S})
    assert metrics[GRAPHS] == 1  # the MLP's forward is one frame: no graph break


@pytest.mark.heavy  # as above: Inductor builds C++
def test_a_compiled_torch_run_ends_without_the_resource_trackers_warning(tmp_path):
    """Before: every compiled torch run ended on 'UserWarning: resource_tracker: There appear to be 1 leaked
    semaphore objects to clean up at shutdown' (torch.compile's progress bar took a multiprocessing lock in the
    worker, which ends with os._exit)."""
    from helpers import FAST_TIMING, run_cli

    out = run_cli("backend=torch", "model=mlp", "mode=function", "tracking=none", f"hydra.run.dir={tmp_path}",
                  *FAST_TIMING, timeout=600)  # fmt: skip
    assert out.returncode == 0 and "FINISHED" in out.stdout, out.stderr[-3000:]
    assert "leaked semaphore" not in out.stderr, out.stderr[-3000:]


def test_parts_that_overrun_the_call_leave_the_execution_out_and_zeros_are_not_recorded():
    heard = Parts({TRACE_S: 0.2, COMPILE_S: 0.0})
    assert figures(heard, first_call_s=0.5) == {TRACE_S: 0.2, EXECUTE_S: pytest.approx(0.3)}
    assert figures(Parts({TRACE_S: 0.7}), first_call_s=0.5) == {TRACE_S: 0.7}
    assert figures(Parts({GRAPHS: 0.0}), first_call_s=0.5) == {}


def test_the_history_watches_every_part_lower_being_better():
    from runner.history.figures import FIGURES as WATCHED
    from runner.history.figures import recorded_figures

    assert all(name in WATCHED and not WATCHED[name].higher_is_better for name in FIGURES)
    recorded = {"first_call_s": 1.0, TRACE_S: 0.1, COMPILE_S: 0.5, EXECUTE_S: 0.4, GRAPHS: 1.0}
    assert recorded_figures(recorded) == recorded


def test_a_runs_summary_keeps_every_value_in_one_column_beside_the_longest_label(capsys, tmp_path):
    """Before: the labels were padded to 16 characters, and 'first-call compile' ran into its value
    ('first-call compile833 ms'), as 'first-call trace' and 'first-call graphs' did."""
    from runner.launch.terminal import print_summary
    from runner.record.result import Result, Status

    parts = {TRACE_S: 0.302, LOWER_S: 0.01, COMPILE_S: 0.833, EXECUTE_S: 0.0292, GRAPHS: 1}
    print_summary(tmp_path, Result(Status.FINISHED, metrics={"time_median_s": 1e-4, "first_call_s": 1.16, **parts}))
    labelled = [line for line in capsys.readouterr().out.splitlines()[1:] if not line.startswith("  results in")]
    assert "first-call compile" in "\n".join(labelled) and len(labelled) == 7, labelled
    starts = {_value_starts(line) for line in labelled}
    assert len(starts) == 1 and None not in starts, labelled


def _value_starts(line: str) -> int | None:
    """The column a summary line's value begins at, after its label and at least one space; None: no label so."""
    from runner.record.table import COLUMNS

    label = max((c.label for c in COLUMNS if line[2:].startswith(f"{c.label} ")), key=len, default=None)
    if label is None:
        return None
    rest = line[2 + len(label) :]
    return len(line) - len(rest.lstrip())

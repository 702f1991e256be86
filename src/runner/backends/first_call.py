"""The first call's parts as a framework reports them of itself: seconds spent tracing, lowering and compiling, and how
many graphs it built, heard while the measurement's first call runs (runner.measure.timing). A backend module that can
say defines `first_call_parts()`, a context manager yielding the `Parts` it fills in; where a framework compiles
nothing or cannot say (NumPy, torch eager) the parts are absent, never zero.

The names here are the record's metric names (result.json; runner.tasks declares them for the tables and the history).
"""

from __future__ import annotations

import sys
import weakref
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any

TRACE_S = "first_call_trace_s"  # a Python function traced into the framework's graph
LOWER_S = "first_call_lower_s"  # that graph lowered to the compiler's input (JAX: jaxpr to StableHLO)
COMPILE_S = "first_call_compile_s"  # the compiler's own work (XLA; AOTAutograd and Inductor)
EXECUTE_S = "first_call_execute_s"  # the first call less the parts above (runner.measure.timing)
GRAPHS = "first_call_graphs"  # graphs built: tf.function traces, XLA programs compiled, frames dynamo compiled
PARTS_S = (TRACE_S, LOWER_S, COMPILE_S)


class Parts(dict[str, float]):
    """The parts heard so far, summed over every graph the first call built."""

    def add(self, key: str, value: float) -> None:
        self[key] = self.get(key, 0.0) + value


def parts_of(backend: Any) -> AbstractContextManager[Parts]:
    """The backend's `first_call_parts()`, or one that hears nothing where the backend module has none."""
    own = getattr(backend, "first_call_parts", None)
    return own() if own is not None else nullcontext(Parts())


def figures(parts: Parts, first_call_s: float) -> dict[str, float]:
    """The parts the framework reported (those above zero) and the first execution, the first call less its traced,
    lowered and compiled parts; {} where it reported none. The execution is left out where the parts exceed the call
    (a framework whose timers overlap): then the figures cannot be taken apart."""
    reported = {key: value for key, value in parts.items() if value > 0}
    if not reported:
        return {}
    rest = first_call_s - sum(reported.get(key, 0.0) for key in PARTS_S)
    if rest > 0:
        reported[EXECUTE_S] = rest
    return reported


# -- each framework's own account --------------------------------------------------------------------------------------

# jax.monitoring's events of jit's compile path (jax._src.dispatch), in the order a first call goes through them
JAX_EVENTS = {
    "/jax/core/compile/jaxpr_trace_duration": TRACE_S,
    "/jax/core/compile/jaxpr_to_mlir_module_duration": LOWER_S,
    "/jax/core/compile/backend_compile_duration": COMPILE_S,
}


@contextmanager
def jax_parts() -> Iterator[Parts]:
    """jit's own compile events (jax.monitoring, public) while the first call runs: the trace to a jaxpr, its lowering
    to StableHLO and XLA's compile, the stages `jit(f).trace(...).lower().compile()` takes apart ahead of time, heard
    inside jit's ordinary first call so that what is timed stays jit's dispatch; GRAPHS counts the programs XLA
    compiled (op by op in eager, each op its own)."""
    import jax.monitoring

    parts = Parts()

    def heard(event: str, duration_secs: float, **_: str | int) -> None:
        key = JAX_EVENTS.get(event)
        if key is not None:
            parts.add(key, duration_secs)
        if key == COMPILE_S:
            parts.add(GRAPHS, 1)

    jax.monitoring.register_event_duration_secs_listener(heard)
    try:
        yield parts
    finally:
        jax.monitoring.unregister_event_duration_listener(heard)


@contextmanager
def torch_parts() -> Iterator[Parts]:
    """torch.compile's own account of the frames it compiled in the first call (torch._dynamo's compilation metrics,
    what TORCH_LOGS=compile_times and tlparse read: torch 2.14 has no public API for them): dynamo's capture of each
    frame (its whole compile less the backend's), the backend's compile (AOTAutograd and Inductor, the backward's
    compile where autograd runs it), and the frames compiled. Nothing where dynamo is not loaded (eager)."""
    utils = sys.modules.get("torch._dynamo.utils")
    read = getattr(utils, "get_compilation_metrics", None)
    before = read() if read is not None else []  # held: their ids stay theirs while the call runs
    parts = Parts()
    try:
        yield parts
    finally:
        seen = {id(entry) for entry in before}
        for entry in read() if read is not None else []:
            if id(entry) not in seen:
                _add_torch_frame(parts, entry)


def _add_torch_frame(parts: Parts, entry: Any) -> None:
    frame_s = getattr(entry, "entire_frame_compile_time_s", None)
    backend_s = getattr(entry, "backend_compile_time_s", None) or 0.0
    backward_us = getattr(entry, "backward_cumulative_compile_time_us", None)
    if frame_s is not None:
        parts.add(TRACE_S, max(frame_s - backend_s, 0.0))
        parts.add(COMPILE_S, backend_s)
        parts.add(GRAPHS, 1)
    if backward_us is not None:
        parts.add(COMPILE_S, backward_us / 1e6)


_TF_FUNCTIONS: weakref.WeakValueDictionary[int, Any] = weakref.WeakValueDictionary()


def watch_tf_function(function: Any) -> Any:
    """A tf.function whose traces tf_parts counts (the backend's compile_step registers each one it makes)."""
    _TF_FUNCTIONS[id(function)] = function
    return function


@contextmanager
def tf_parts() -> Iterator[Parts]:
    """tf.function's tracing while the first call runs: TensorFlow's own graph-building timer (the
    /tensorflow/core/tf_function/graph_building_time_usecs counter its telemetry reads, not counting a function
    traced inside another twice; no public API reads it), and GRAPHS, the traces of the tf.functions compile_step
    made (experimental_get_tracing_count). Graph optimisation and XLA's compile happen in the first execution."""
    try:
        from tensorflow.python.eager.polymorphic_function import tracing_compilation
    except ImportError:  # a TensorFlow that moved it: the traces alone
        tracing_compilation = None
    counter = getattr(tracing_compilation, "_graph_building_time_counter", None)
    cell = counter.get_cell() if counter is not None else None
    before_us = cell.value() if cell is not None else 0
    traces = {key: function.experimental_get_tracing_count() for key, function in list(_TF_FUNCTIONS.items())}
    parts = Parts()
    try:
        yield parts
    finally:
        if cell is not None:
            parts.add(TRACE_S, (cell.value() - before_us) / 1e6)
        for key, function in list(_TF_FUNCTIONS.items()):
            parts.add(GRAPHS, function.experimental_get_tracing_count() - traces.get(key, 0))

"""Tasks: what a job computes and times on its workload, each a class named by `conf/task/NAME.yaml`'s `_target_`.

A task builds the timed call from a backend's primitives, computes its float64 numpy reference (or asks the
workload for its own: `workload.own_reference`, model=keras's float64 run on TensorFlow), and yields
results keyed by their tensors.h5 path ("outputs/y", "gradients/dense.weight", "trained/dense.weight"), so
recording and comparison never need to know which task ran. The built-in ones are in `runner.tasks.builtin`
and `runner.tasks.train_step`; a task of your own is a subclass of `Task` and its yaml (docs/models.md).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from functools import partial
from types import ModuleType
from typing import Any, ClassVar

import numpy as np

from runner.backends import first_call
from runner.config import TASK_META_KEYS, ConfigError, class_named, plain


@dataclass
class TaskRun:
    step: Callable[[], object]  # the call that is timed
    results: Callable[[object], dict[str, np.ndarray]]  # the first call's output -> {h5 path: numpy array}
    warnings: Callable[[], list[str]] = list  # read after timing: what makes these timings not what they claim
    # per-sample series of the task's own beside timing.series' (runner.measure.samples.Series's methods)
    series: dict[str, Any] = field(default_factory=dict)


@dataclass
class Setup:
    """What a task is built from: the workload on its backend, weights and inputs placed on the device."""

    backend: ModuleType
    workload: Any
    mode: str
    device: str
    params: dict  # the trained weights
    inputs: dict  # "x", and "labels" where the workload has a loss
    constants: dict  # weights that enter the model but are not trained (batch-norm statistics)
    per_example: bool  # the mode computes one result per example (conf/mode/NAME.yaml)
    precision: str = "full"  # conf/precision/NAME.yaml: mixed policies wrap the model (Backend.with_precision)
    dtype: str = "float32"  # the run's dtype: what the task allocates beside the weights is made in it
    machine: dict = field(default_factory=dict)  # the facts of the machine the task asked for (Task.machine_facts)

    def model(self) -> tuple[Callable, Callable]:
        """forward(params, x) and loss(params, x, labels) on this backend under the run's precision policy (its
        autocast or casts: the loss comes back in float32), constants folded in."""
        backend, workload, constants = self.backend, self.workload, self.constants
        # partials add no Python frame: microsecond workloads time what timeit times
        whole_forward = partial(workload.forward, backend)
        whole_loss = workload.loss and partial(workload.loss, backend)
        if not workload.own_precision:  # Keras applies its own dtype policy
            whole_forward = backend.with_precision(whole_forward, self.precision, self.device)
            whole_loss = whole_loss and backend.with_precision(whole_loss, self.precision, self.device)
        if not constants:
            return whole_forward, whole_loss  # op workloads have no loss

        def forward(params: dict, x):
            return whole_forward({**params, **constants}, x)

        def loss(params: dict, x, labels):
            return whole_loss({**params, **constants}, x, labels)

        return forward, loss


@dataclass(frozen=True)
class Metric:
    """A metric of a task's own, as the tables show it (runner.record.table)."""

    key: str  # its name in result.json's metrics: "tpot_p50_s"
    heading: str  # "per token"
    kind: str = "number"  # "seconds" or "number": how its cells are written
    in_terminal: bool = True  # a sweep's terminal table has room for it (runs.csv and runs.md have every one)
    # a series of `runner history` of its own (runner.history.figures): the least factor a step must move it
    # by to be a change; None: not watched
    watched: float | None = None
    higher_is_better: bool = False  # its direction, where watched (tokens/s: a step up is an improvement)


# Every task's first call taken apart where the framework reports its parts (runner.backends.first_call,
# docs/record.md), each watched at the gate PyTorch's dashboard puts on compilation latency, 1.15x, lower being
# better. Not in a sweep's terminal table (a row must fit); runs.csv and runs.md have them.
FIRST_CALL_PARTS = (
    Metric(first_call.TRACE_S, "first-call trace", "seconds", in_terminal=False, watched=1.15),
    Metric(first_call.LOWER_S, "first-call lower", "seconds", in_terminal=False, watched=1.15),
    Metric(first_call.COMPILE_S, "first-call compile", "seconds", in_terminal=False, watched=1.15),
    Metric(first_call.EXECUTE_S, "first execution", "seconds", in_terminal=False, watched=1.15),
    Metric(first_call.GRAPHS, "first-call graphs", in_terminal=False, watched=1.15),
)


class Task:
    """A task: its timed call (`build`), its float64 reference (`reference`), what it may be combined with, and how
    it presents itself (`unit`, `part`, `metrics_shown`, `page_lines`): the record, the report and the MLflow pages
    read those and name no task."""

    per_example_modes: ClassVar[bool] = False  # may run in a per-example mode (mode=vectorized_map, map_fn)
    like: ClassVar[str] = "inference"  # the built-in task this one runs like: a model that supports that one
    # supports this one, and states its memory and FLOPs for it (runner.measure.limits)
    unit: ClassVar[str] = "a call"  # one timed call in words, as an answer says a time: "363 µs a step"
    # where a call is made of parts timed too: (the metric of a part's median time, the part in words)
    part: ClassVar[tuple[str, str] | None] = None
    metrics_shown: ClassVar[tuple[Metric, ...]] = ()  # its own metrics, as the tables' columns
    backward: ClassVar[bool] = False  # its call differentiates the model (what a workload's `describe` is told)
    # facts of the machine its figures are read against, measured by the job for it (Setup.machine): "memory_bandwidth"
    # (runner.measure.bandwidth: host memory, on device=cpu)
    machine_facts: ClassVar[tuple[str, ...]] = ()
    # where a call repeats one piece of work, timed piece by piece (a generation's decode steps): the per-sample series
    # holding each piece's seconds (TaskRun.series) and the column the repeats begin at. Where too few whole calls
    # fit the budget for an interval, a comparison compares the pieces (runner.report.comparison).
    repeated_parts: ClassVar[tuple[str, int] | None] = None

    def __init__(self, name: str):
        self.name = name

    def build(self, setup: Setup) -> TaskRun:
        raise NotImplementedError

    @classmethod
    def parts_of(cls, series: dict[str, Any]) -> np.ndarray | None:
        """The repeated parts of each sample's call (samples x parts, seconds), from its per-sample series by name
        (tensors.h5 `timings/`, or a job's columns); None where the task times none or they were not kept."""
        if cls.repeated_parts is None:
            return None
        name, first = cls.repeated_parts
        rows = series.get(name)
        return None if rows is None or np.ndim(rows) != 2 else np.asarray(rows, dtype=float)[:, first:]

    def reference(self, setup: Setup, params: dict, inputs: dict) -> dict[str, np.ndarray]:
        """The results computed in float64 numpy from the same weights (every one, constants too) and inputs, as
        the backend holds them, back in numpy; {} where there is none."""
        return {}

    def agreement(self, setup: Setup, params: dict, inputs: dict, results: dict[str, np.ndarray]) -> dict[str, float]:
        """How the results agree with the float64 reference: errors_vs_reference of `reference`, for most tasks."""
        return errors_vs_reference(results, self.reference(setup, params, inputs))

    def metrics(self, call_s: float, samples: dict[str, list]) -> dict[str, float]:
        """Metrics of its own, from the seconds per call every rate uses (the typical time:
        rate_time in runner.measure.figures) and the samples' columns (its series among them)."""
        return {}

    def check(self, workload: Any) -> None:
        """Refuse (ConfigError, naming the setting) what this workload cannot take, before the framework is imported."""

    def size_setting(self, workload: Any, batch_size: int) -> str:
        """The settings that size the job, as the memory check's refusal names them."""
        return workload.size_setting(batch_size)

    def array_elements(self, workload: Any, batch_size: int, per_example: bool) -> dict[str, int] | None:
        """{"weights", "inputs", "results", "activations"} element counts of one call for the memory check
        (runner.measure.limits), from the workload's forward (Workload.forward_size); None: not checked. A call
        that is one forward: its outputs, and one layer's activations at a time."""
        size = workload.forward_size(batch_size)
        if size is None:
            return None
        return {
            "weights": size.weights,
            "inputs": size.inputs,
            "results": size.outputs,
            "activations": size.layer_activations,
        }

    def flops(self, workload: Any, batch_size: int) -> float | None:
        """FLOPs of one call, for the cost note: a forward's."""
        size = workload.forward_size(batch_size)
        return size and size.flops

    def describe(self, setup: Setup) -> dict[str, str]:
        """What ran, in words, for result.json's environment (e.g. how the training step was compiled)."""
        return {}

    @classmethod
    def one_call(cls, config: dict) -> str:
        """What one timed call is, in words, from the run's settings, where the unit alone does not say it: 'a
        generation of 16 prompt + 8 new tokens, batch 32'; '' otherwise. The run's page and a sweep's answer say it."""
        return ""

    @classmethod
    def page_lines(cls, config: dict, metrics: dict, environment: dict, seconds: Callable[[float], str]) -> list[str]:
        """Lines of its own on a run's page in the MLflow UI (runner.tracking.run_page), from the run's record, times
        written by `seconds`: first, what one call of it is and its own figures."""
        return []


def backward_elements(size: Any, results: int) -> dict[str, int]:
    """Element counts of a call that differentiates a forward (runner.models.ForwardSize) into `results` elements:
    every layer's activations are held for the backward pass, with the outputs and their gradient."""
    held = size.layers * size.layer_activations + 2 * size.outputs if size.layer_activations else 0
    return {"weights": size.weights, "inputs": size.inputs, "results": results, "activations": held}


def with_workload_warnings(setup: Setup, task_warnings: Callable[[], list[str]] = list) -> Callable[[], list[str]]:
    """The task's warnings and the workload's own (`workload.run_warnings()`: model=keras says where Keras computes a
    float64 model in float32), read after timing and the reference."""
    return lambda: task_warnings() + setup.workload.run_warnings()


def task_class(target: object = None, name: object = None) -> type[Task]:
    """The Task class a run's `task._target_` names, or where its record kept only the task's name (MLflow's params)
    the class conf/task/NAME.yaml names; Task itself where neither imports (a record of a task since removed): its
    presentation is then a call's."""
    target = target if isinstance(target, str) and target else _builtin_targets().get(str(name))
    try:
        cls = class_named("task._target_", str(target))
    except ConfigError:
        return Task
    return cls if issubclass(cls, Task) else Task


@functools.cache
def _builtin_targets() -> dict[str, str]:
    """The runner's own tasks (conf/task/NAME.yaml): NAME -> the class its `_target_` names."""
    from omegaconf import OmegaConf

    from runner.locations import CONFIG_DIR

    found = {
        path.stem: OmegaConf.select(OmegaConf.load(path), "_target_") for path in (CONFIG_DIR / "task").glob("*.yaml")
    }
    return {name: str(target) for name, target in sorted(found.items()) if target}


@functools.cache
def builtin_metrics() -> tuple[Metric, ...]:
    """The metrics the runner's own tasks show, each once: the tables' columns and the MLflow runs view's beside the
    times, so that no module outside the tasks names a task's metric; then the first call's parts, which every task
    records where the framework reports them."""
    shown: dict[str, Metric] = {}
    for target in _builtin_targets().values():
        for metric in task_class(target).metrics_shown:
            shown.setdefault(metric.key, metric)
    return (*shown.values(), *(metric for metric in FIRST_CALL_PARTS if metric.key not in shown))


def build_task(task: Mapping[str, Any]) -> Task:
    """The task object that `task._target_` names, built from the rest of the task's settings."""
    cls = class_named("task._target_", task.get("_target_") or "")
    if not (isinstance(cls, type) and issubclass(cls, Task)):
        raise ConfigError(f"task._target_={task['_target_']} must be a subclass of runner.tasks.Task")
    node = plain(task)
    arguments = {k: v for k, v in node.items() if k not in TASK_META_KEYS}
    try:
        return cls(name=str(node["name"]), **arguments)
    except TypeError as error:
        raise ConfigError(f"task={node['name']}: {error}") from None


def timed_call(backend: ModuleType, fn: Callable, mode: str, device: str, params: dict, *args) -> Callable[[], object]:
    """fn compiled for `mode` with all its arguments bound: C-level partials, no extra Python frame.

    The weights are bound before compiling, as a model holds its weights: tf.function then captures
    them instead of flattening a dict argument on every call (BENCHMARKS.md, what this suite found).
    """
    return partial(backend.compile_step(partial(fn, params), mode, device), *args)


def forward_outputs(setup: Setup, params: dict, inputs: dict, known: dict | None = None) -> dict[str, np.ndarray]:
    """Untimed eager forward pass (and loss, where there are labels) under the run's precision policy, from every
    weight (`params`, constants included), for the record; skipped where the timed call's own output is `known`
    already (one more 40 s call for a 20000^2 matmul)."""
    known = known or {}
    if "outputs/y" in known and "labels" not in inputs:
        return {}
    backend = setup.backend
    forward, loss = replace(setup, constants={}).model()
    results = {"outputs/y": backend.to_numpy(forward(params, inputs["x"]))}
    if "labels" in inputs:
        results["outputs/loss"] = np.asarray(backend.to_numpy(loss(params, inputs["x"], inputs["labels"])))
    return results


def float64(arrays: dict) -> dict[str, np.ndarray]:
    return {k: np.asarray(v, np.float64) for k, v in arrays.items()}


def errors_vs_reference(results: dict[str, np.ndarray], reference: dict[str, np.ndarray]) -> dict[str, float]:
    """Largest absolute error over all compared tensors, and the largest error relative to each
    tensor's own largest reference magnitude (a max-norm relative error, stable near zeros)."""
    shared = [k for k in reference if k in results]
    if not shared:
        return {}
    for k in shared:
        if results[k].shape != reference[k].shape:
            raise ValueError(f"{k} has shape {results[k].shape}, the reference {reference[k].shape}")
    abs_errs = {k: float(np.max(np.abs(results[k].astype(np.float64) - reference[k]), initial=0.0)) for k in shared}
    rel_errs = [abs_errs[k] / max(float(np.max(np.abs(reference[k]), initial=0.0)), 1e-300) for k in shared]
    return {"max_abs_err_vs_reference": max(abs_errs.values()), "max_rel_err_vs_reference": max(rel_errs)}

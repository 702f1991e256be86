"""The job spec, typed end to end: read once from the composed config; nothing below it reads a config node."""

from __future__ import annotations

import re

import pytest
from omegaconf import OmegaConf

from runner.config import PROJECT_ROOT, ConfigError, TimingConfig, choices, compose
from runner.measure.timing import LoopSettings
from runner.models import build_workload, check_known_wrong
from runner.spec import JobSpec

BELOW_THE_SPEC = ("backends", "models", "tasks", "measure/data.py", "measure/timing.py", "measure/limits.py")


def test_the_spec_holds_typed_timing_and_plain_settings():
    cfg = compose(["task=train_step", "optimizer=adam", "data=hdf5", "data.path=/x.h5", "timing.max_time_s=1.5"])
    spec = JobSpec.of(cfg)
    assert isinstance(spec.timing, TimingConfig) and spec.timing.max_time_s == 1.5 and spec.timing.rounds == 40
    assert LoopSettings.of(spec.timing).max_time_s == 1.5
    for settings in (spec.model_settings, spec.task_settings, spec.data_settings):
        assert type(settings) is dict and not any(OmegaConf.is_config(value) for value in settings.values())
    assert spec.task_settings["optimizer"]["name"] == "adam"  # ${optimizer}, resolved
    assert type(spec.data_settings["name"]) is str and spec.data_settings["name"] == "hdf5"  # not the enum
    assert spec.data_settings["dataset"] == "images"  # the schema's default


@pytest.mark.parametrize("backend", ["numpy", "torch", "tensorflow", "tnp", "jax"])
def test_jax_and_tensorflows_backends_declare_that_their_calls_record_the_callers_stack(backend):
    """What makes a job time its calls from a thread of their own (runner.measure.timing.measure's own_thread):
    the backend's yaml, not a probe of the module. numpy and torch record no stack; their calls stay on the job's
    thread."""
    records = backend in ("tensorflow", "tnp", "jax")
    assert JobSpec.of(compose([f"backend={backend}"])).records_caller_stack is records


def test_a_combination_known_wrong_is_refused_from_the_plain_settings_as_from_the_config():
    cfg = compose(["model=transformer", "backend=jax", "task=jacobian"])
    for model in (cfg.model, JobSpec.of(cfg).model_settings):
        with pytest.raises(ConfigError, match="^model=transformer with backend=jax task=jacobian dtype=float32 is"):
            check_known_wrong(model, choices(cfg))
        assert type(build_workload(model)).__name__ == "Transformer"
    cfg = compose(["model=transformer", "backend=jax", "task=jacobian", "dtype=float64"])
    check_known_wrong(JobSpec.of(cfg).model_settings, choices(cfg))


def test_nothing_below_the_spec_reads_a_config_node():
    src = PROJECT_ROOT / "src" / "runner"
    paths = [src / name for name in BELOW_THE_SPEC]
    files = [p for path in paths for p in (path.rglob("*.py") if path.is_dir() else [path])]
    reading = [str(p.relative_to(src)) for p in files if re.search(r"\b(DictConfig|ListConfig)\b", p.read_text())]
    assert not reading, reading

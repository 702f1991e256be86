"""What a person sees of a run in MLflow and the report says what was timed, in words (issue 48): a training step's
optimizer in its name, description and plot title, the optimizer's convention explained, the loss before and after
the checked steps, params without Python class paths or `None`, a CPU run's device by its model, and run names
that show what a sweep varies within the ~16 characters a runs list shows."""

from __future__ import annotations

import copy

import pandas as pd
from omegaconf import OmegaConf

from runner import identity
from runner.config import compose
from runner.record.naming import run_name, run_params
from runner.record.result import Result, Status
from runner.tracking.run_page import note_content

ADAM = {"name": "adam", "lr": 0.001, "beta1": 0.9, "beta2": 0.999, "eps": 1e-08}
CONFIG = {
    "backend": {"name": "torch", "module": "runner.backends.torch_backend"},
    "model": {"name": "mlp", "hidden": 64},
    "task": {"name": "train_step", "optimizer": ADAM, "checked_steps": 10},
    "mode": {"name": "eager"},
    "device": {"name": "cpu"},
    "dtype": "float32",
    "precision": {"name": "full"},
    "optimizer": ADAM,
    "data": {"name": "random", "path": None},
    "batch_size": 32,
    "seed": 0,
    "threads": None,
    "timing": {
        "max_time_s": 0.5,
        "series": {
            "sample_cpu_mhz": "runner.measure.machine_load.CpuClock",
            "sample_end_unix_s": "runner.measure.samples.SampleEnd",
        },
    },
    "tracking": {"uri": "sqlite:///x.db"},
}
COPIED = {"task.optimizer": "optimizer"}
RUNS_LIST_WIDTH = 16  # characters of a run's name the MLflow runs list shows before cutting it


def test_a_training_steps_name_says_its_optimizer():
    assert run_name(CONFIG) == "torch-mlp-train_step(adam)-eager-cpu-float32"
    assert run_name(CONFIG, {"backend": "torch,tensorflow"}, "0") == "torch · mlp-train_step(adam)-eager-cpu-float32 #0"
    # swept, the optimizer comes first, by its choice alone, and is not said twice
    assert run_name(CONFIG, {"optimizer": "sgd,adam"}, "1") == "adam · torch-mlp-train_step-eager-cpu-float32 #1"
    gradients = {**CONFIG, "task": {"name": "gradients"}}
    assert run_name(gradients) == "torch-mlp-gradients-eager-cpu-float32"  # no other task reads the optimizer


def test_what_a_sweep_varies_fits_the_width_a_runs_list_shows():
    """Each job's name opens on its values of what the sweep varies, short: a group by its choice, a key by its last
    part, a group whose choice does not say what it is ('full') by both; two jobs differ within the first 16
    characters."""
    jobs = [
        ({"backend": "torch,tensorflow", "seed": "0,1"}, "torch · seed=1"),
        ({"backend": "torch,tensorflow", "optimizer": "sgd,adam"}, "torch · adam"),
        ({"precision": "full,bf16_mixed"}, "precision=full"),
        ({"optimizer.lr": "0.1,1", "backend": "torch,jax"}, "lr=0.1 · torch"),
        ({"model.arch": "MobileNetV2,ResNet50"}, "MobileNetV2"),
        ({"timing.max_time_s": "0.5,1"}, "max_time_s=0.5"),
    ]
    values = {"seed": "1", "optimizer.lr": "0.1", "model.arch": "MobileNetV2", "timing.max_time_s": "0.5"}
    for swept, opening in jobs:
        job_swept = {k: values.get(k, v) for k, v in swept.items()}
        name = run_name(CONFIG, job_swept, "3")
        assert name.startswith(opening), name
        assert len(opening) <= RUNS_LIST_WIDTH


def test_params_read_as_words_and_the_case_key_stays_what_it_was():
    params = run_params(CONFIG, COPIED)
    assert params["threads"] == "framework default" and "None" not in params.values()
    assert "data.path" not in params  # unset, and random data reads no path
    assert params["timing.series"] == "sample_cpu_mhz, sample_end_unix_s"
    assert not [v for v in params.values() if "runner." in v], "a Python class path in the params"
    with_target = {**CONFIG, "task": {**CONFIG["task"], "_target_": "runner.tasks.train_step.TrainStep"}}
    assert "task._target_" not in run_params(with_target, COPIED)  # task.name says it
    assert params["optimizer.name"] == "adam" and params["optimizer.lr"] == "0.001"
    # the history's case key hashes the config as it was before (the key of this config on main before issue 48),
    # so runs recorded before and after stay one case
    key, name = _case(CONFIG, COPIED)
    assert key == "a2591e041f12d98a"
    assert name == "torch-mlp-train_step(adam)-eager-cpu-float32 batch_size=32"


def test_what_a_backend_declares_is_no_param_and_leaves_the_case_key_as_it_was():
    """backend.records_caller_stack (added with JAX's timing thread) is data about the backend, as backend.dtypes is:
    a run's params and its history's case key leave it out, so runs recorded before it stay one case with later ones."""
    config = OmegaConf.to_container(compose(["backend=jax"]), resolve=True)
    before = copy.deepcopy(config)
    del before["backend"]["records_caller_stack"]
    assert config["backend"]["records_caller_stack"] is True
    assert not [k for k in run_params(config, ()) if k.startswith("backend.") and k != "backend.name"]
    assert _case(config, ()) == _case(before, ())


def _case(config: dict, copied) -> tuple[str, str]:
    found = identity.of_config(config, copied, {}, run_name(config)).case
    return found.key, found.name


def _trained(convention: str, **metrics: float) -> Result:
    return Result(
        status=Status.FINISHED,
        config=CONFIG,
        metrics={"time_median_s": 0.0004, "time_iqr_s": 0.00001, "first_call_s": 0.3, **metrics},
        environment={"device": "cpu", "cpu": "AMD EPYC 7B13", "framework": "torch", "optimizer_convention": convention},
    )


def test_a_training_runs_description_says_optimizer_convention_and_loss():
    note = note_content(_trained("torch", loss_before=1.6546759, loss_after=0.5920660))
    first, *lines = note.split("  \n")
    assert first.startswith("**torch-mlp-train_step(adam)-eager-cpu-float32**, batch 32, seed 0")
    said = "\n".join(lines)
    assert "optimizer adam (lr 0.001, beta1 0.9, beta2 0.999, eps 1e-08); optimizer_convention torch: " in said
    assert "as torch.optim and optax write Adam" in said
    assert "loss on the batch 1.655 before training, 0.5921 after 10 steps" in said
    keras = note_content(_trained("keras"))
    assert "optimizer_convention keras: Keras's convention" in keras and "epsilon hat" in keras
    assert "loss on the batch" not in keras  # a diverged run records no loss; its warning says so
    inference = Result(status=Status.FINISHED, config={**CONFIG, "task": {"name": "inference"}})
    assert "optimizer" not in note_content(inference)


def test_the_plot_title_names_a_training_steps_optimizer():
    from runner.report.plots import _workload_title

    row = {"params.model.name": "mlp", "params.task.name": "train_step", "params.batch_size": 32}
    adam = {**row, "params.optimizer.name": "adam"}  # a run's params hold it where its task reads it
    assert _workload_title(pd.Series(adam), []) == "mlp train_step (adam), batch 32"
    assert _workload_title(pd.Series(row), []) == "mlp train_step, batch 32"
    gradients = {**row, "params.task.name": "gradients", "params.optimizer.name": float("nan")}
    assert _workload_title(pd.Series(gradients), []) == "mlp gradients, batch 32"


def test_a_numpy_runs_device_is_the_cpu_model():
    from runner.backends import numpy_backend
    from runner.record import environment

    env = environment.collect(numpy_backend.environment("cpu"))
    assert env["device_name"] == env["cpu"] == environment.cpu_name()


def test_a_generations_description_opens_with_what_one_call_is_and_its_token_figures():
    config = {**CONFIG, "batch_size": 1, "model": {"name": "gpt2", "prompt_len": 8},
              "task": {"name": "generate", "new_tokens": 8}}  # fmt: skip
    metrics = {"time_median_s": 0.004, "time_typical_s": 0.0039, "time_iqr_s": 0.0001, "first_call_s": 0.3,
               "ttft_s": 0.0012, "tpot_p50_s": 0.0003, "tpot_p99_s": 0.0005, "tokens_per_s": 2000.0}  # fmt: skip
    first, what, figures, *rest = note_content(Result(status=Status.FINISHED, config=config, metrics=metrics)).split(
        "  \n"
    )
    assert what == "one call: a generation of 8 prompt + 8 new tokens, batch 1"
    assert figures == "first token 1.2 ms; per token p50 300 µs; p99 500 µs; 2000 tokens/s"
    assert rest[0].startswith("typical 3.9 ms a generation (what ratios and rates use); median 4 ms ± 100 µs (IQR)")

"""Bad input: one clear line on stderr, a non-zero exit, no traceback."""

from __future__ import annotations

import pytest

from runner.config import ConfigError, check_combination


def _error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.strip()]


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (["backend=foo"], "backend=foo is not an option (allowed backend: jax, numpy, tensorflow, tnp, torch)"),
        (["dtype=float8"], "dtype=float8"),
        (["batch_size=abc"], "batch_size=abc"),
        (["no_such_key=1"], "no_such_key"),
        (["backend=numpy", "mode=function"], "backend=numpy cannot run mode=function"),
        (["backend=torch", "device=cuda"], "device=cuda"),
        (["batch_size=-3"], "batch_size=-3: must be a positive integer"),
        (["seed=99999999999999999999"], "seed=99999999999999999999: must be an integer from 0 to 2**63 - 1"),
        (["seed=-1"], "seed=-1: must be an integer from 0 to 2**63 - 1"),
        (["-m", "backend=numpy,foo"], "backend=foo is not an option"),
        (["model=mlp", "model.pretrained=true"], "model=mlp has no setting model.pretrained"),  # seeded weights only
        (["model._target_=no.such.Thing"], "model._target_=no.such.Thing cannot be imported (ModuleNotFoundError"),
        (["+timing.series.x=no.such.Thing"], "timing.series.x=no.such.Thing cannot be imported (ModuleNotFoundError"),
        (["+timing.series.samples_s=runner.measure.samples.SampleEnd"], "samples_s is the samples' own column"),
        (["+model.extra=1"], "+model.extra=1: model=mlp has no setting extra (its settings: in_features, hidden,"),
        (
            ["model=gpt2", "task=generate", "+task.max_new_tokens=8"],
            "task=generate has no setting max_new_tokens (its settings: new_tokens, prompt_lengths); did you mean "
            "task.new_tokens?",
        ),
        (["model=gpt2", "task=generate", "+model.prompt=Hello"], "did you mean model.prompt_len?"),
        (["model=gpt2", "task=generate", "task.new_tokens=1e1"], "task.new_tokens=10.0 is not a valid int"),
        (["model=gpt2", "task=generate", "task.new_tokens=abc"], "task.new_tokens='abc' is not a valid int"),
        (["model=gpt2", "task=generate", "task.new_tokens=null"], "task.new_tokens=None is not a valid int"),
        (["model=gpt2", "task=generate", "task.new_tokens=true"], "task.new_tokens=True is not a valid int"),
        (["model=gpt2", "task=generate", "task.new_tokens=0"], "task.new_tokens=0: must be a positive integer"),
        (
            ["model=mlp", "+implementation=keras_hub", "task=inference", "backend=torch"],
            "model=gpt2_keras_hub has no setting in_features (its settings: backend_module, layers,",
        ),
    ],
)
def test_bad_input_is_one_line_and_nonzero(cli, tmp_path, overrides, expected):
    if "device=cuda" in overrides:
        from runner.config import nvidia_driver_present

        if nvidia_driver_present():
            pytest.skip("this machine has a GPU")
    result = cli("tracking=none", f"hydra.run.dir={tmp_path}", *overrides)
    assert result.returncode != 0
    lines = _error_lines(result.stderr)
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: ")
    assert expected in lines[0]
    assert "Traceback" not in result.stdout + result.stderr


@pytest.mark.parametrize("added", ["+batchsize=8", "++batchsize=8"])
def test_a_key_added_beside_a_setting_is_warned_with_its_nearest_name(cli, tmp_path, added):
    result = cli("tracking=none", f"hydra.run.dir={tmp_path}", "timing.max_time_s=0.01", added)
    assert result.returncode == 0, result.stderr
    assert f"warning: {added} adds a key no setting of the runner has; did you mean batch_size?" in result.stderr


@pytest.mark.parametrize("backend", ["numpy", "torch", "tensorflow", "tnp", "jax"])
def test_a_single_runs_impossible_combination_is_refused_before_its_framework_and_leaves_no_run(cli, tmp_path, backend):
    """Refused by the command line's check: exit 2, one line, no run folder, no store, no framework imported (a sweep's
    job is refused in its turn and recorded instead: test_sweep)."""
    run_dir, store = tmp_path / "run", tmp_path / "mlflow.db"
    result = cli(f"backend={backend}", "model=gpt2", "task=gradients", f"hydra.run.dir={run_dir}",
                 f"tracking.uri=sqlite:///{store}", env={"PYTHONIMPORTTIME": "1"})  # fmt: skip
    assert result.returncode == 2
    timed = {line for line in result.stderr.splitlines() if line.startswith("import time:")}
    errors = [line for line in _error_lines(result.stderr) if line not in timed]
    assert errors == ["error: model=gpt2 runs only task=inference or task=generate, not task=gradients"]
    imported = {line.rpartition("|")[2].strip() for line in timed}
    assert not imported & {"torch", "tensorflow", "jax", "mlflow"}
    assert not run_dir.exists() and not store.exists()


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["backend=numpy", "mode=xla"], "backend=numpy cannot run mode=xla"),
        (["backend=numpy", "dtype=bfloat16"], "cannot compute in dtype=bfloat16"),
        (["backend=torch", "mode=map_fn", "task=inference"], "task=inference has none"),
        (["model=matmul", "task=gradients"], "only task=inference"),
        (["batch_size=0"], "batch_size=0"),
    ],
)
def test_combination_rules(make_config, overrides, message):
    with pytest.raises(ConfigError, match=message):
        check_combination(make_config(*overrides))


def test_valid_combinations_pass(make_config):
    for overrides in (["backend=numpy", "mode=map_fn"], ["backend=tensorflow", "mode=xla", "task=jacobian"]):
        check_combination(make_config(*overrides))


@pytest.mark.parametrize("blocks", ["-1", "0", "2.5", "abc", "true"])
def test_a_launchers_blocks_must_be_a_number_of_nodes_refused_before_anything_is_written(cli, tmp_path, blocks):
    """Issue 79: blocks=-1 failed to unpack, 10**9 ran out of memory making its blocks, 0 was taken as not set."""
    sweep_dir = tmp_path / "sweep"
    result = cli("-m", "hydra/launcher=slurm", f"hydra.launcher.blocks={blocks}", "backend=numpy", "tracking=none",
                 f"hydra.sweep.dir={sweep_dir}")  # fmt: skip
    assert result.returncode == 2 and _error_lines(result.stderr) == [
        f"error: hydra.launcher.blocks={blocks.replace('true', 'True')}: the number of nodes that each run every job "
        "of the sweep, 1 or more (null: a node per job)"
    ]
    assert not sweep_dir.exists()


def test_a_launcher_refuses_blocks_set_in_its_yaml_as_the_command_line_is_refused():
    """A value of blocks from a launcher's yaml, which preflight does not see, is refused by the launcher itself."""
    from runner.launch import cluster_jobs, launchers

    assert cluster_jobs.blocks_asked(None) is None and cluster_jobs.blocks_asked(3) == 3
    with pytest.raises(launchers.SweepRefused) as refused:
        cluster_jobs.blocks_asked(-1)
    assert refused.value.line.startswith("hydra.launcher.blocks=-1: the number of nodes")


@pytest.mark.parametrize("value", ["abc", "0", "4,x"])
def test_a_thread_variable_that_is_no_count_is_refused_not_recorded_as_another_machine(cli, tmp_path, value):
    """Issue 79: OMP_NUM_THREADS=abc ran with the library's default and became a new kind of machine in the history."""
    result = cli("backend=numpy", "tracking=none", f"hydra.run.dir={tmp_path}/run", env={"OMP_NUM_THREADS": value})
    assert result.returncode == 2 and _error_lines(result.stderr) == [
        f"error: OMP_NUM_THREADS={value}: a number of threads, 1 or more (OpenMP's nested form: 4,2), or unset"
    ]
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (["model=matmul", "task=inference", "model.n=-5"], "model.n=-5: must be a positive integer"),
        (["model=llama", "task=generate", "model.heads=3"], "model.d_model=64 is not divisible by model.heads=3"),
        (["model=mlp", "data=image"], "data=image feeds images: it needs an image model"),
    ],
)
def test_a_setting_only_the_config_can_refuse_is_refused_before_any_framework_loads(cli, tmp_path, overrides, expected):
    """Issue 79: 43 of 350 refusals came 3-8 s late, after the framework loaded, each leaving a run folder and a
    FAILED run. A workload built without a framework (Workload.builds_without_framework) checks its settings in
    preflight: one line, exit 2, no framework imported (PYTHONIMPORTTIME), nothing written."""
    run_dir = tmp_path / "run"
    timed = {"PYTHONIMPORTTIME": "1"}
    result = cli("backend=torch", *overrides, "tracking=none", f"hydra.run.dir={run_dir}", env=timed)
    assert result.returncode == 2 and expected in result.stderr
    lines = result.stderr.splitlines()
    imported = {line.rsplit("|", 1)[-1].strip() for line in lines if line.startswith("import time")}
    assert not imported & {"torch", "tensorflow", "jax", "keras"}
    assert not run_dir.exists()

"""Bad input: one clear line on stderr, a non-zero exit, no traceback."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from runner.config import CONFIG_DIR, ConfigError, check_combination


def _error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.strip()]


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (["backend=foo"], "backend=foo is not an option (allowed backend: jax, numpy, tensorflow, tnp, torch)"),
        (["dtype=float8"], "dtype=float8"),
        (["batch_size=abc"], "batch_size=abc"),
        (["no_such_key=1"], "the run has no setting no_such_key (its settings: backend, device, model, mode, task,"),
        (["timing.min_time_s=1"], "timing has no setting timing.min_time_s (its settings: warmup_s, min_warmup_calls,"),
        (["timing.min_time_s=1"], "; did you mean timing.max_time_s?"),  # Hydra said: Key 'min_time_s' not in ...
        (["data.batch=3"], "data=random has no setting data.batch (its settings: path, dataset, image_size)"),
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


LONG = "y" * 300
MODELS = ", ".join(sorted(p.stem for p in (CONFIG_DIR / "model").glob("*.yaml")))
PROMPT_LENGTHS = (
    "a list of one or more prompt lengths, each 1 .. model.prompt_len (e.g. [16,3,9]), or null for every prompt "
    "model.prompt_len tokens"
)
# Each kind of refusal that needs only the config, as issue 79's fuzz found them late (after the framework loaded, a
# run folder and a FAILED run written) or as a traceback: the overrides, the environment, the one line ({out}: the
# output folder, {ck}: a checkpoint folder whose config.json is made from `checkpoint` below).
REFUSALS = {
    "model size": (["model=matmul", "task=inference", "model.n=-5"], {}, "model.n=-5: must be a positive integer"),
    "model heads": (["model=llama", "task=generate", "model.heads=3"], {},
                    "model.d_model=64 is not divisible by model.heads=3: each head takes d_model / heads features"),
    "data fit": (["model=mlp", "data=image"], {},
                 "data=image feeds images: it needs an image model (alexnet, resnet*, cyclegan)"),
    "task size": (["model=llama", "task=generate", "task.new_tokens=0"], {},
                  "task.new_tokens=0: must be a positive integer"),
    "prompt lengths text": (["model=llama", "task=generate", "task.prompt_lengths='123'"], {},
                            f"task.prompt_lengths='123': {PROMPT_LENGTHS}"),
    "prompt lengths number": (["model=llama", "task=generate", "task.prompt_lengths=5"], {},
                              f"task.prompt_lengths=5: {PROMPT_LENGTHS}"),
    "prompt lengths floats": (["model=llama", "task=generate", "task.prompt_lengths=[1.5,4]"], {},
                              f"task.prompt_lengths=[1.5, 4]: {PROMPT_LENGTHS}"),
    "prompt lengths booleans": (["model=llama", "task=generate", "task.prompt_lengths=[true,4]"], {},
                                f"task.prompt_lengths=[True, 4]: {PROMPT_LENGTHS}"),
    "prompt lengths empty": (["model=llama", "task=generate", "task.prompt_lengths=[]"], {},
                             f"task.prompt_lengths=[]: {PROMPT_LENGTHS}"),
    "prompt lengths range": (["model=llama", "task=generate", "task.prompt_lengths=[0,4]"], {},
                             "task.prompt_lengths=[0, 4]: each must be 1 .. model.prompt_len=16, the width the batch "
                             "is left-padded to"),
    "a sweep's job": (["-m", "model=matmul", "task=inference", "model.n=8,-5"], {},
                      "job 1 (model.n=-5): model.n=-5: must be a positive integer"),
    "a sweep's job by two values": (["-m", "model=llama", "task=generate", "dtype=float32,float64", "model.heads=4,3"],
                                    {}, "job 1 (dtype=float32 model.heads=3): model.d_model=64 is not divisible by "
                                    "model.heads=3: each head takes d_model / heads features"),
    "launcher blocks": (["-m", "hydra/launcher=slurm", "hydra.launcher.blocks=0"], {},
                        "hydra.launcher.blocks=0: the number of nodes that each run every job of the sweep, 1 or more "
                        "(null: a node per job)"),
    "thread variable": ([], {"OMP_NUM_THREADS": "abc"},
                        "OMP_NUM_THREADS=abc: a number of threads, 1 or more (OpenMP's nested form: 4,2), or unset"),
    "checkpoint type": (["model=llama", "task=generate", "model.weights={ck}"], {"hidden_size": "64"},
                        '{ck}/config.json: hidden_size="64" must be a positive integer'),
    "checkpoint value": (["model=llama", "task=generate", "model.weights={ck}"], {"num_key_value_heads": 0},
                         "{ck}/config.json: num_key_value_heads=0 must be a positive integer or null"),
    "checkpoint eps": (["model=llama", "task=generate", "model.weights={ck}"], {"rms_norm_eps": float("nan")},
                       "{ck}/config.json: rms_norm_eps=nan must be a finite number above 0"),
    "checkpoint folder": (["model=llama", "task=generate", "model.weights={ck}"], None,
                          "cannot read {ck}/config.json: IsADirectoryError: [Errno 21] Is a directory: "
                          "'{ck}/config.json'"),
    "choice as a path": (["model=mlp/../mlp"], {},
                         f"model=mlp/../mlp: name a model, not a path (allowed model: {MODELS})"),
    "output folder empty": (["hydra.run.dir="], {},
                            "hydra.run.dir is empty: name a folder to write in, or leave it out for the default one"),
    "output under /proc": (["hydra.run.dir=/proc/runner-x"], {},
                           "hydra.run.dir=/proc/runner-x: cannot create folders in /proc (No such file or directory)"),
    "output name too long": ([f"hydra.run.dir={{out}}/{LONG}/run"], {},
                             f"hydra.run.dir={{out}}/{LONG}/run: the name yyyyyyyyyyyy... is 300 bytes long, and "
                             "{out} takes names of at most 255"),
    "store name too long": ([f"tracking.uri=sqlite:///{{out}}/{LONG}/x.db"], {},
                            f"tracking.uri=sqlite:///{{out}}/{LONG}/x.db: File name too long"),
}  # fmt: skip


def refused_before_anything(cli, out: Path, argv: list[str], env: dict, expected: str) -> None:
    """Exit 2, the one line expected (warnings aside), no framework imported (PYTHONIMPORTTIME), `out` left empty."""
    given = {a.split("=", 1)[0] for a in argv}
    where = [f"{key}={value}" for key, value in HERE.items() if key not in given]
    result = cli(*argv, *[w.format(out=out) for w in where], env={**env, "PYTHONIMPORTTIME": "1"})
    lines = result.stderr.splitlines()
    imported = {line.rsplit("|", 1)[-1].strip() for line in lines if line.startswith("import time")}
    said = [line for line in lines if line.strip() and not line.startswith(("import time", "warning: "))]
    assert (result.returncode, said) == (2, [f"error: {expected}"]), result.stderr[-3000:]
    assert not imported & {"torch", "tensorflow", "jax", "keras", "mlflow"}
    assert list(out.iterdir()) == []


HERE = {"hydra.run.dir": "{out}/run", "hydra.sweep.dir": "{out}/sweep", "tracking.uri": "sqlite:///{out}/mlflow.db"}


@pytest.mark.parametrize("kind", sorted(REFUSALS))
def test_each_kind_of_refusal_that_needs_only_the_config_comes_before_any_framework(cli, tmp_path, kind):
    """Issue 79: 43 of 350 refusals came 3-8 s late, after the framework loaded, each leaving a run folder and a
    FAILED run; others were tracebacks. Each kind is refused in preflight: one line, exit 2, no framework imported
    (PYTHONIMPORTTIME), nothing written in the output folder (no run folder, no sweep folder, no store)."""
    overrides, settings, expected = REFUSALS[kind]
    out, ck = tmp_path / "out", tmp_path / "checkpoint"
    out.mkdir()
    (ck / "config.json").mkdir(parents=True)
    if settings is not None and "model.weights={ck}" in overrides:
        (ck / "config.json").rmdir()
        config = {"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4}
        (ck / "config.json").write_text(json.dumps({**config, **settings}))
    env = settings if "model.weights={ck}" not in overrides else {}
    argv = ["backend=torch", *(o.format(out=out, ck=ck) for o in overrides)]
    refused_before_anything(cli, out, argv, env or {}, expected.format(out=out, ck=ck))


@pytest.mark.parametrize(
    ("params", "overrides"),
    [
        ({}, ["backend=numpy,torch", "model.n=8,16,32", "model=matmul"]),
        ({"seed": "0,1"}, ["backend=numpy,torch", "seed=2,3", "+x=range(1,3)", "hydra.launcher.blocks=1"]),
        ({"model": "mlp,transformer"}, ["threads=1"]),
    ],
)
def test_a_sweeps_jobs_are_those_hydras_basic_sweeper_launches_in_its_order(params, overrides):
    """preflight checks the jobs Hydra would launch, numbered as their folders are (params first, as Hydra reads
    them; a key typed again keeps its place)."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.override_parser.overrides_parser import OverridesParser

    from runner.launch.job_checks import jobs

    lines = [f"{k}={v}" for k, v in params.items()] + overrides
    expected = BasicSweeper.split_arguments(OverridesParser.create().parse_overrides(lines), None)[0]
    assert jobs(overrides, params) == expected and len(expected) > 1


def test_a_sweep_whose_choices_cannot_run_together_is_left_to_run_its_other_jobs(capsys):
    """numpy cannot run mode=function: that job is refused in its turn and recorded beside the others (docs/sweeps.md),
    while a job's settings refuse the whole sweep before any job runs."""
    from runner.launch import preflight

    assert preflight.check_argv(["-m", "backend=numpy,torch", "mode=eager,function", "tracking=none"]) is not None
    with pytest.raises(preflight.BadInput, match=r"^job 1 \(backend=numpy model.n=-5\): model.n=-5: must be a"):
        preflight.check_argv(["-m", "backend=numpy,torch", "model=matmul", "task=inference", "model.n=8,-5"])


@pytest.fixture
def mounted(tmp_path):
    """A tmpfs (64 KiB unless told) mounted at tmp_path/NAME with `options` (root only): skipped where mounting is not
    allowed."""
    import subprocess

    made = []

    def mount(name: str, options: str, size: str = "64k") -> Path:
        point = tmp_path / name
        point.mkdir()
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},{options}", "tmpfs", str(point)],
                              capture_output=True)  # fmt: skip
        if done.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
        made.append(point)
        return point

    yield mount
    for point in made:
        subprocess.run(["umount", str(point)], check=False)


@pytest.mark.heavy
@pytest.mark.parametrize("device", ["read-only", "full"])
def test_an_output_folder_on_a_device_that_cannot_take_it_is_one_line(cli, tmp_path, mounted, device):
    """A read-only file system (where root's access() says yes) and a full one (where a folder can still be made,
    and Hydra's first file was a traceback, errno 28): refused in preflight, nothing written."""
    point = mounted("device", "ro" if device == "read-only" else "rw")
    if device == "full":
        _fill(point)
        expected = f"hydra.run.dir={point}/run: {point} has 0 KiB free, a run's record needs at least 1024 KiB"
    else:
        expected = f"hydra.run.dir={point}/run: cannot create folders in {point} (Read-only file system)"
    before = sorted(point.iterdir())
    out = tmp_path / "out"
    out.mkdir()
    refused_before_anything(cli, out, ["backend=torch", f"hydra.run.dir={point}/run"], {}, expected)
    assert sorted(point.iterdir()) == before


def _fill(point: Path) -> None:
    """Write into the device until it has no byte left."""
    import os

    fd = os.open(point / "fill", os.O_WRONLY | os.O_CREAT)
    try:
        while os.write(fd, b"\0" * 4096):
            pass
    except OSError:
        pass
    finally:
        os.close(fd)


@pytest.mark.heavy
def test_a_device_that_fills_during_the_run_keeps_the_result_and_says_so_in_one_line(cli, tmp_path, mounted):
    """1.5 MiB free passes preflight; the run's tensors.h5 (a 600 x 600 matmul's inputs and outputs, 8.6 MB) does not
    fit: result.json keeps the timings and metrics, one warning names the file and errno 28, no traceback."""
    point = mounted("small", "rw", size="1536k")
    store = tmp_path / "mlflow.db"
    result = cli("backend=numpy", "model=matmul", "task=inference", "model.n=600", "timing.max_time_s=0.2",
                 f"hydra.run.dir={point}/run", f"tracking.uri=sqlite:///{store}")  # fmt: skip
    said = [line for line in result.stderr.splitlines() if "could not be written" in line]
    assert said == [f"warning: {point}/run/tensors.h5 could not be written (No space left on device): result.json "
                    "keeps the rest"], result.stderr[-3000:]  # fmt: skip
    assert result.returncode == 0 and "Traceback" not in result.stdout + result.stderr
    assert "Traceback" not in (point / "run" / "job.log").read_text()
    saved = json.loads((point / "run" / "result.json").read_text())
    assert saved["status"] == "FINISHED" and saved["metrics"]["time_median_s"] > 0
    assert said[0].removeprefix("warning: ") in saved["warnings"]
    assert not (point / "run" / "tensors.h5").exists() and not list((point / "run").glob(".tensors.h5.*"))


def test_a_control_on_a_single_run_is_said_to_time_nothing(capsys):
    """control=NAME adds a job to a sweep; on a single run it timed nothing without a word (issue 79)."""
    from runner.launch import preflight

    preflight.check_argv(["model=matmul", "task=inference", "model.n=8", "control=matmul", "tracking=none"])
    said = [line for line in capsys.readouterr().err.splitlines() if "control" in line]
    assert said == ["warning: control=matmul is timed beside a sweep's jobs (-m): this single run times none"]
    preflight.check_argv(["-m", "model=matmul", "task=inference", "model.n=8", "control=matmul", "tracking=none"])
    assert "control" not in capsys.readouterr().err

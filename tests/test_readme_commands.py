"""Every `run.py` command the documentation prints runs, as printed, in a fresh process.

Collected when the tests are collected, so a command added to the docs is tested without touching this file:
- README.md and the pages of the documentation site, docs/*.md: every line of a fenced code block that calls
  run.py, or the same app as installed (`tensor-runner`, `runner run`, `python -m runner run`: ENTRIES), `$ `
  prompts stripped (the other `runner` subcommands and Python scripts: test_doc_commands.py);
- experiments/README.md: the same, and inline code spans that call run.py;
- experiments/*.yaml: the comment header's commands; `...` there stands for `python run.py +experiment=NAME`.

Each runs as `sys.executable run.py ARGS` (or its installed entry) from a scratch folder holding the files the
command names (`data.path=dog.jpg`, `model.weights=horse2zebra_0.4.0.pth`, torchvision's file for
`model.pretrained=true` in a scratch $TORCH_HOME), generated small, with these overrides appended: a timing budget
of one sample (CAPS), a scratch MLflow store and scratch Hydra directories. It must end as documented: every job
FINISHED, except jobs the combination rules refuse (the docs show such a sweep), and the exit status the
docs print after `; echo $?`, else 0 when every job finished and 1 when one was refused.

cuda commands skip without an NVIDIA driver, SLURM and Ray launcher commands without a cluster.
Sweeps of more than FAST_JOBS jobs run with `-m slow`; commands on full-size vision models, the
BERT-base and GPT-2-small sized transformers, and the commands other tests of the default set cover (the
convnet sweeps, single runs of what they run; COVERED_IN_PROCESS) with `-m heavy` (CI runs them after the default set).
"""

from __future__ import annotations

import functools
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import yaml
from omegaconf import OmegaConf
from photos import scene

from runner.config import PROJECT_ROOT, ConfigError, check_combination, nvidia_driver_present
from runner.spec import JobSpec

CAPS = ("timing.warmup_s=0", "timing.min_warmup_calls=0", "timing.min_repeats=1", "timing.max_time_s=0.001")
FAST_JOBS = 4  # sweeps up to this many jobs run in the default test path
SEPARATORS = {"&&", "||", ";", "|", "&"}
PRETRAINED_MODELS = ("alexnet", "resnet18", "resnet50", "resnet101")


@dataclass(frozen=True)
class Command:
    source: str  # file:line
    text: str  # as printed
    args: tuple[str, ...]  # what follows run.py
    printed_status: int | None = None  # the number the docs print after `; echo $?`
    env: tuple[tuple[str, str], ...] = ()  # `NAME=value` assignments before the python command
    entry: tuple[str, ...] = ("run.py",)  # how the app is called: a key of ENTRIES


def _tokens(line: str) -> list[str]:
    lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
    lexer.whitespace_split, lexer.commenters = True, "#"
    return list(lexer)


def parse(line: str, source: str, printed_status: int | None = None) -> Command | None:
    """The run.py call in a shell line (`./setup.sh && .venv/bin/python run.py ...; echo $?`), or the same app's as
    installed (`tensor-runner ...`, `runner run ...`, `python -m runner run ...`), if any."""
    try:
        tokens = _tokens(line.strip().removeprefix("$ "))
    except ValueError:
        return None
    found = _entry(tokens)
    if found is None:
        return None  # no app called (run.py named in a file listing, `runner report`)
    first, start, entry = found
    end = next((i for i in range(start, len(tokens)) if tokens[i] in SEPARATORS), len(tokens))
    begin = max((i + 1 for i in range(first) if tokens[i] in SEPARATORS), default=0)
    env = tuple(tuple(t.split("=", 1)) for t in tokens[begin:first] if re.fullmatch(r"[A-Z_]+=.*", t))
    return Command(source, line.strip(), tuple(tokens[start:end]), printed_status, env, entry)


# How the docs call the app (the words, as ENTRIES' keys) -> the command this test runs for it
ENTRIES = {
    ("run.py",): (sys.executable, str(PROJECT_ROOT / "run.py")),
    ("python", "-m", "runner", "run"): (sys.executable, "-m", "runner", "run"),
    ("runner", "run"): (str(Path(sys.executable).with_name("runner")), "run"),
    ("tensor-runner",): (str(Path(sys.executable).with_name("tensor-runner")),),
}


def _entry(tokens: list[str]) -> tuple[int, int, tuple[str, ...]] | None:
    """(the command's first word, its first argument, its key in ENTRIES) of the app's call among a line's words."""
    for i, token in enumerate(tokens):
        after, python = tokens[i + 1 : i + 4], re.fullmatch(r"(.*/)?python[0-9.]*", token)
        in_place = i == 0 or tokens[i - 1] in SEPARATORS or re.fullmatch(r"[A-Z_]+=.*", tokens[i - 1]) is not None
        if python and after[:1] and re.fullmatch(r"(.*/)?run\.py", after[0]):
            return i, i + 2, ("run.py",)
        if python and after == ["-m", "runner", "run"]:
            return i, i + 4, ("python", "-m", "runner", "run")
        if in_place and re.fullmatch(r"(.*/)?runner", token) and after[:1] == ["run"]:
            return i, i + 2, ("runner", "run")
        if in_place and re.fullmatch(r"(.*/)?tensor-runner", token):
            return i, i + 1, ("tensor-runner",)
    return None


def markdown_commands(path: Path, inline: bool = False) -> list[Command]:
    """run.py lines of fenced code blocks, and (inline=True) code spans outside them that are not
    templates (`python run.py +experiment=NAME`, `run.py -m ...`)."""
    commands, in_block, lines = [], False, path.read_text().splitlines()
    for number, line in enumerate(lines, start=1):
        if line.lstrip().startswith("```"):
            in_block = not in_block
            continue
        source = f"{path.relative_to(PROJECT_ROOT)}:{number}"
        if in_block:
            found = parse(line, source, _printed_status(lines, number) if "echo $?" in line else None)
            commands += [found] if found else []
        elif inline:
            spans = [span for span in re.findall(r"`([^`]*run\.py[^`]*)`", line) if not _is_template(span)]
            commands += [c for span in spans if (c := parse(span, source))]
    return commands


def _is_template(text: str) -> bool:
    return "..." in text or bool(re.search(r"=[A-Z][A-Z_]+(\s|$)", text))


def _printed_status(lines: list[str], number: int) -> int | None:
    """The exit status printed after a `$ ...; echo $?` line: the last bare number before the block ends."""
    status = None
    for line in lines[number:]:
        if line.lstrip().startswith(("```", "$ ")):
            break
        status = int(line) if line.strip().isdigit() else status
    return status


def yaml_header_commands(path: Path) -> list[Command]:
    commands = []
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.startswith("#"):
            break
        label, _, rest = line.lstrip("# ").partition(":")
        text = line.lstrip("# ") if "run.py" in label or not rest else rest.strip()
        if text.startswith("..."):  # "small grid: ... KEY=VALUES"
            text = f"python run.py +experiment={path.stem}{text.removeprefix('...')}"
        text = re.sub(r"\s*\([^)]*\)\s*$", "", text)  # a trailing "(synthetic input)" is prose
        found = parse(text, f"{path.relative_to(PROJECT_ROOT)}:{number}")
        commands += [found] if found else []
    return commands


def documentation_pages() -> list[Path]:
    """README.md and the documentation site's pages (mkdocs.yml: docs/)."""
    return [PROJECT_ROOT / "README.md", *sorted((PROJECT_ROOT / "docs").glob("*.md"))]


def documented_commands() -> list[Command]:
    commands = [command for page in documentation_pages() for command in markdown_commands(page)]
    commands += markdown_commands(PROJECT_ROOT / "experiments/README.md", inline=True)
    for path in sorted((PROJECT_ROOT / "experiments").glob("*.yaml")):
        commands += yaml_header_commands(path)
    unique: dict[tuple, Command] = {}
    for command in commands:
        unique.setdefault((command.entry, command.args), command)
    return list(unique.values())


# -- what a command costs and needs ----------------------------------------------------------------


def _overrides(command: Command) -> dict[str, str]:
    return dict(arg.lstrip("+~").split("=", 1) for arg in command.args if "=" in arg and not arg.startswith("-"))


def experiment_file(command: Command) -> Path | None:
    name = _overrides(command).get("experiment")
    return PROJECT_ROOT / "experiments" / f"{name}.yaml" if name else None


def n_jobs(command: Command) -> int:
    """How many jobs the command's sweep has: the experiment's sweep, with the command's values in place, and its
    control's where it names one (runner.launch.control)."""
    swept: dict[str, str] = {}
    experiment = experiment_file(command)
    if experiment is not None:
        config = yaml.safe_load(experiment.read_text()) or {}
        swept.update({k: str(v) for k, v in config.get("hydra", {}).get("sweeper", {}).get("params", {}).items()})
    for key, value in _overrides(command).items():  # the command line replaces the file's sweep of a key
        key = key.removeprefix("hydra.sweeper.params.")
        if key in swept or ("," in value and not value.startswith("[")):
            swept[key] = value
    sizes = [2 if "runner.devices" in v and nvidia_driver_present() else len(v.split(",")) for v in swept.values()]
    control = _overrides(command).get("control", "null") != "null" and "-m" in command.args
    return (int(np.prod(sizes)) if sizes else 1) + control


def needs_gpu(command: Command) -> bool:
    return any(re.fullmatch(r"device=(.*,)?cuda(,.*)?", arg) for arg in command.args)


def needs_cluster(command: Command) -> str | None:
    """What a command's launcher needs that a CI machine lacks: SLURM (sinfo answers) or a Ray cluster."""
    launcher = _overrides(command).get("hydra/launcher")
    if launcher == "slurm" and not _slurm_answers(_overrides(command).get("hydra.launcher.partition", "")):
        return "needs SLURM (scripts/local-slurm.sh up; pytest -m slurm)"
    if launcher == "ray_cluster":
        return "needs a running Ray cluster"
    return None


def models_named(command: Command) -> set[str]:
    """The vision models a command may run: named in it, or in its experiment file."""
    text = " ".join(command.args)
    experiment = experiment_file(command)
    if experiment is not None and not re.search(r"(^| )(hydra\.sweeper\.params\.)?model=", text):
        text += experiment.read_text()
    return set(re.findall(r"\b(alexnet|resnet18|resnet50|resnet101|cyclegan)\b", text))


def full_size_vision(command: Command) -> bool:
    """Whether the command runs a vision model at its own input size (224 or 256): seconds per call on 2 cores."""
    return bool(models_named(command)) and "data.image_size" not in _overrides(command)


def preset_transformer(command: Command) -> bool:
    """Whether the command builds a BERT-base or GPT-2-small sized transformer: over 100 million weights."""
    return bool(re.search(r"\bmodel=(transformer_bert_base|(transformer_)?gpt2_small)\b", " ".join(command.args)))


@functools.cache
def _slurm_answers(partition: str) -> bool:
    if shutil.which("sinfo") is None:
        return False
    query = ["sinfo", "-h", *(["-p", partition] if partition else [])]
    try:
        answer = subprocess.run(query, capture_output=True, text=True, timeout=10)
    except subprocess.TimeoutExpired:
        return False
    return answer.returncode == 0 and bool(answer.stdout.strip())


def experiment_checked_commands() -> dict[str, Command]:
    """Per experiment file, the last command of its header (its small grid where it has one):
    test_experiments.py runs it as printed and checks what the experiment is about."""
    paths = sorted((PROJECT_ROOT / "experiments").glob("*.yaml"))
    return {path.stem: yaml_header_commands(path)[-1] for path in paths}


# Documented commands that another test runs as printed and checks further: run once, not twice.
RUN_BY_OTHER_TESTS = {
    "model=gpt2 task=generate model.weights=tiny-gpt2": (
        "test_checkpoints.py::test_the_documented_command_runs_as_printed"
    ),
    **{
        f"model=llama task=generate model.weights=tiny-{family}": (
            "test_llama_checkpoints.py::test_the_documented_commands_run_as_printed"
        )
        for family in ("llama", "qwen2", "qwen3", "mistral")
    },
    "-m backend=tensorflow,torch,jax model=keras model.arch=MobileNetV2 task=inference data.image_size=96 "
    "batch_size=2": "test_own_models.py::test_keras_mobilenetv2_same_seed_same_outputs_on_tensorflow_torch_and_jax",
    **{" ".join(c.args): f"test_experiments.py ({name})" for name, c in experiment_checked_commands().items()},
}

# Documented commands that the default set runs in-process (each backend checked further) or runs itself through
# run.py with the same settings, and that CI runs as printed with the heavy set: the convnet sweeps over several
# frameworks (a minute or two on 2 cores), and single runs whose fresh process (10-25 s of framework imports on a
# busy 2-core machine) repeats a test of the default set. Keeps the default set short; README.md's commands all stay
# in it.
COVERED_IN_PROCESS = {
    "model=llama task=generate backend=jax mode=function model.kv_heads=4": (
        "test_llama.py (every backend and mode against the float64 reference, grouped-query attention among them)"
    ),
    "model=llama task=generate backend=torch batch_size=8 task.prompt_lengths=[16,1,9,4,13,7,2,11]": (
        "test_generation_padding.py (Llama and GPT-2 on numpy and torch: each prompt's tokens as alone)"
    ),
    "model=gpt2 task=generate backend=jax mode=function batch_size=4 task.prompt_lengths=[3,16]": (
        "test_generation_padding.py (GPT-2 padded on torch; jax compiled in the heavy set)"
    ),
    "model=llama_smollm2_135m task=generate backend=torch task.new_tokens=8": (
        "test_decode_bandwidth.py::test_a_generate_run_records_its_decode_bandwidth_and_the_machines (a tiny Llama)"
    ),
    "model=keras_hub_llama task=generate backend=jax": (
        "test_keras_hub_llama.py::test_keras_hub_generates_model_llamas_tokens (each Keras backend, smaller sizes)"
    ),
    "-m backend=torch,tensorflow model=resnet18 data.image_size=64 batch_size=2": (
        "test_vision.py::test_resnet18_gradients_agree_under_torch_names[tensorflow] (the job on both) and "
        "test_user_paths.py::test_every_vision_model_agrees_on_every_photo[resnet18] (the outputs agree)"
    ),
    "-m backend=numpy,torch model=mlp tracking.uri=sqlite:////tmp/sw/mlflow.db hydra.sweep.dir=/tmp/sw/sweep": (
        "test_sweep.py::test_sweep_is_one_parent_run_with_a_child_per_job (a numpy,torch sweep into its own store)"
    ),
    "-m backend=numpy seed=0,1 hydra.job_logging.root.level=WARNING hydra.hydra_logging.root.level=WARNING": (
        "docs/sweeps.md's sweep with Hydra's logging disabled (the default set runs it as printed) and "
        "test_sweep_output.py (the warnings a sweep prints)"
    ),
    "backend=torch model=torchvision model.arch=mobilenet_v3_small task=gradients mode=vectorized_map batch_size=2 "
    "data.image_size=64": (
        "test_vision.py::test_per_example_gradients_of_a_convnet[torch-vectorized_map] and "
        "test_own_models.py::test_torchvision_arch_beyond_the_built_in_ones_predicts_as_its_module"
    ),
    "model=transformer backend=numpy task=jacobian dtype=float64 model.seq_len=8 model.out_features=4": (
        "test_transformer.py::test_float64_agrees_with_the_reference[numpy-eager-jacobian]"
    ),
    "-m backend=numpy seed=0,1 hydra.verbose=runner": (
        "test_sweep_output.py::test_a_quiet_sweep_prints_its_table_without_the_job_lines_and_verbose_shows_debug"
    ),
    "backend=torch precision=bf16_mixed": (
        "test_precision.py::test_bf16_mixed_runs_on_cpu_less_exact_than_full_and_within_its_tolerance[torch]"
    ),
    "backend=torch precision=tf32": "test_precision.py::test_tf32_on_cpu_exits_with_one_line (run.py, exit 1)",
    "backend=torch model=matmul task=inference model.n=300000": (
        "test_limits.py::test_huge_matmul_refused_before_allocating_with_the_estimate (run.py, exit 1)"
    ),
    "backend=jax mode=function task=gradients": (
        "test_jax.py::test_lower_precisions_compute_in_their_dtype[float32-float32-1e-05]"
    ),
    "backend=torch task=train_step": (
        "test_train_step.py::test_mlp_training_agrees_with_float64_reference[torch-eager-float64-sgd] and "
        "[torch-eager-float32-adam]"
    ),
    "backend=numpy task=train_step batch_size=512": (
        "test_train_step.py::test_mlp_training_agrees_with_float64_reference[numpy-eager-float32-sgd]"
    ),
    "model=transformer backend=torch task=gradients": (
        "test_transformer.py::test_float32_agrees_with_the_reference[gradients-torch]"
    ),
    "model=transformer backend=jax mode=function model.causal=true task=gradients": (
        "test_transformer.py::test_float64_agrees_with_the_reference[jax-function-gradients] (causal) and "
        "::test_float32_agrees_with_the_reference[gradients-jax]"
    ),
    "-m hydra.searchpath=[file:///tmp/own_model/conf] model=small_convnet backend=numpy,torch,tensorflow,tnp "
    "dtype=float64 task=gradients": (
        "test_own_models.py::test_own_model_from_outside_the_repository_matches_its_float64_reference and "
        "::test_own_model_runs_from_the_command_line_with_the_users_pythonpath"
    ),
    "-m backend=tensorflow model=keras model.arch=MobileNetV2 mode=eager,function,xla task=inference "
    "data.image_size=96 batch_size=2": (
        "test_own_models.py::test_keras_mobilenetv2_same_seed_same_outputs_on_tensorflow_torch_and_jax"
    ),
    "model=transformer backend=tensorflow mode=vectorized_map model.seq_len=16 batch_size=8": (
        "test_transformer.py::test_float32_per_example_gradients_agree_with_the_reference[tensorflow]"
    ),
    "backend=tensorflow mode=vectorized_map batch_size=128": (
        "test_numerics.py::test_per_example_gradients_sum_to_batch_gradient[tensorflow-vectorized_map]"
    ),
    "backend=tensorflow mode=function task=jacobian": "test_numerics.py::test_batch_jacobian_is_analytic",
    "model=gpt2 task=generate backend=jax mode=function": (
        "test_generation.py::test_every_backend_generates_the_reference_tokens[jax-function-float32]"
    ),
    "model=gpt2 task=generate backend=torch task.new_tokens=32 batch_size=4": (
        "test_generation.py::test_every_backend_generates_the_reference_tokens[torch-eager-float32]"
    ),
    "+experiment=generation variant=numpy,torch,jax_function task.new_tokens=4 model.prompt_len=4": (
        "test_generation.py (each backend), test_pooled.py (the answer per token)"
    ),
    "model=gpt2_keras_hub task=generate backend=jax": "test_generation_keras.py (jax, in its own process: heavy)",
}


def _param(command: Command):
    marks = []
    if " ".join(command.args) in RUN_BY_OTHER_TESTS:
        marks.append(pytest.mark.skip(reason=f"run as printed by {RUN_BY_OTHER_TESTS[' '.join(command.args)]}"))
    if needs_gpu(command):
        marks.append(pytest.mark.skipif(not nvidia_driver_present(), reason="needs an NVIDIA GPU"))
    if needs_cluster(command):
        marks.append(pytest.mark.skip(reason=needs_cluster(command)))
    if n_jobs(command) > FAST_JOBS:
        marks.append(pytest.mark.slow)
    elif full_size_vision(command) or preset_transformer(command) or " ".join(command.args) in COVERED_IN_PROCESS:
        marks.append(pytest.mark.heavy)
    called = "" if command.entry == ("run.py",) else f"{' '.join(command.entry)} "
    return pytest.param(command, marks=marks, id=f"{command.source} {called}{' '.join(command.args)}"[:150])


COMMANDS = documented_commands()


# -- the files commands name ---------------------------------------------------------------------


def provide_files(command: Command, folder: Path, torch_home: Path) -> None:
    overrides = _overrides(command)
    if "data.path" in overrides:
        _make_data(folder / overrides["data.path"])
    if "model.weights" in overrides:
        _make_weights(folder / overrides["model.weights"], models_named(command) & {"cyclegan", *PRETRAINED_MODELS})
    for folder_named in re.findall(r"file://([^,\]]+)/conf", overrides.get("hydra.searchpath", "")):
        _copy_example(Path(folder_named))
    if overrides.get("model.pretrained") == "true":
        for model in sorted(models_named(command) & set(PRETRAINED_MODELS)):
            _make_hub_checkpoint(model, torch_home)


def _copy_example(folder: Path) -> None:
    """A user's own config folder the docs copy from examples/ first (`cp -r examples/NAME FOLDER`), as the
    example is now (an older copy left in FOLDER is brought up to date)."""
    example = PROJECT_ROOT / "examples" / folder.name
    if example.is_dir():
        shutil.copytree(example, folder, dirs_exist_ok=True)


def _make_data(path: Path) -> None:
    from PIL import Image

    if path.exists():
        return
    if path.suffix.lower() in ("", ".jpg", ".jpeg", ".png"):  # a 400x300 photo, e.g. dog.jpg or PHOTO
        image_format = "PNG" if path.suffix.lower() == ".png" else "JPEG"
        Image.fromarray(scene(400, 300, seed=len(path.name))).save(path, format=image_format)
    else:
        pytest.fail(f"{path.name}: teach provide_files to make this kind of data file")


def _make_weights(path: Path, models: set[str]) -> None:
    """A seeded state dict in torch's legacy format, like the seed's horse2zebra_0.4.0.pth (torch 0.4)."""
    import torch

    from runner.models.vision import VisionModel

    if path.exists():
        return
    if len(models) != 1:
        pytest.fail(f"{path.name}: cannot tell which model's weights to make (found {sorted(models)})")
    params = VisionModel(models.pop(), 224).init_params(np.random.default_rng(0))
    state = {name: torch.from_numpy(value).float() for name, value in params.items()}
    torch.save(state, path, _use_new_zipfile_serialization=False)


def _make_hub_checkpoint(model: str, torch_home: Path) -> None:
    """A seeded torchvision model's state dict under torchvision's own file name."""
    import torch
    import torchvision

    from runner.models.weights import PRETRAINED_FILES

    path = torch_home / "hub" / "checkpoints" / PRETRAINED_FILES[model]
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        torch.manual_seed(0)
        torch.save(getattr(torchvision.models, model)().eval().state_dict(), path)


# -- the test ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def scratch(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("user")


def test_the_docs_have_commands():
    sources = {command.source.split(":")[0] for command in COMMANDS}
    assert {"README.md", "experiments/README.md", "docs/running.md", "docs/sweeps.md"} <= sources
    assert len(COMMANDS) >= 20 and all(command.args or command.source.startswith("README") for command in COMMANDS)


@pytest.mark.parametrize("command", [_param(c) for c in COMMANDS])
def test_documented_command_runs_as_printed(command: Command, scratch: Path, tmp_path: Path):
    run_as_printed(command, scratch, tmp_path)


def run_as_printed(command: Command, scratch: Path, tmp_path: Path) -> tuple[subprocess.CompletedProcess, list[dict]]:
    """Run a documented command as printed (with CAPS, a scratch store and scratch Hydra folders) and check it
    ended as documented; returns its process and its jobs' result.json, in job order."""
    torch_home = scratch / "torch-home"
    provide_files(command, scratch, torch_home)
    appended = (
        *CAPS,
        f"tracking.uri=sqlite:///{scratch}/mlflow.db",
        f"hydra.run.dir={tmp_path}/run",
        f"hydra.sweep.dir={tmp_path}/sweep",
    )
    documented = dict(command.env)
    paths = [documented.pop("PYTHONPATH", ""), str(PROJECT_ROOT / "src")]
    env = {
        **os.environ,
        **documented,
        "PYTHONPATH": os.pathsep.join(p for p in paths if p),
        "TORCH_HOME": str(torch_home),
    }
    result = subprocess.run(
        [*ENTRIES[command.entry], *command.args, *appended],
        cwd=scratch,
        env=env,
        capture_output=True,
        text=True,
        timeout=1200,
    )
    output = f"{command.source}: {command.text}\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    paths = sorted(tmp_path.glob("*/**/result.json"), key=lambda p: [int(x) if x.isdigit() else x for x in p.parts])
    results = [json.loads(p.read_text()) for p in paths]
    if command.printed_status == 2:  # refused by the command line's check: one line, nothing written
        lines = [line for line in result.stderr.splitlines() if line.strip()]
        assert result.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: ") and not results, output
        return result, results
    assert results, output
    refused = [r for r in results if r["status"] != "FINISHED"]
    for r in refused:
        assert _free_memory_masked(r.get("error")) == _free_memory_masked(_refusal(r["config"])), (
            f"{r['status']}: {r.get('error')}\n{output}"
        )
    expected = command.printed_status if command.printed_status is not None else int(bool(refused))
    assert result.returncode == expected, output
    assert len(results) == n_jobs(command) or n_jobs(command) == 1, output
    return result, results


def _free_memory_masked(line: str | None) -> str | None:
    """The free memory a refusal quotes moves between two reads of it."""
    return line and re.sub(r"[\d.]+ [KMGTP]?B is free", "X is free", line)


def _refusal(config: dict) -> str | None:
    """The one line the combination rules or the memory check give for this config, or None when both accept it."""
    from runner.config import choices
    from runner.measure import limits
    from runner.models import build_workload, check_known_wrong
    from runner.tasks import build_task

    cfg = OmegaConf.create(config)
    try:
        check_combination(cfg)
        check_known_wrong(cfg.model, choices(cfg))
        task = build_task(cfg.task)
        limits.check_fits(build_workload(cfg.model), JobSpec.of(cfg), choices(cfg)["device"], task)
    except ConfigError as error:
        return str(error)
    return None


def test_commands_are_expanded_and_classified():
    """The collector reads the forms the docs use."""
    line = "$ .venv/bin/python run.py -m backend=numpy,torch model=mlp hydra.sweep.dir=/tmp/x; echo $?"
    command = parse(line, "x:1", 1)
    assert command.args == ("-m", "backend=numpy,torch", "model=mlp", "hydra.sweep.dir=/tmp/x")
    assert n_jobs(command) == 2 and command.printed_status == 1
    assert parse("./setup.sh && .venv/bin/python run.py   # comment", "x:2").args == ()
    assert parse(".venv/bin/mlflow ui --backend-store-uri sqlite:///outputs/mlflow.db", "x:3") is None
    grid = parse("python run.py +experiment=resnet_inference hydra.sweeper.params.model=resnet18", "x:4")
    assert n_jobs(grid) == 6 and models_named(grid) == {"resnet18"}
    assert n_jobs(parse("python run.py +experiment=resnet_inference", "x:5")) == 24
    assert needs_gpu(parse("python run.py backend=torch device=cuda", "x:6"))
    installed = parse("cd ~/my-project && tensor-runner backend=numpy", "x:7")
    assert installed.entry == ("tensor-runner",) and installed.args == ("backend=numpy",)
    assert (
        parse("python -m runner run +experiment=sigmoid_scaling  # an experiment", "x:8").args[0]
        == "+experiment=sigmoid_scaling"
    )
    assert parse(".venv/bin/runner run -m seed=0,1", "x:9").entry == ("runner", "run")
    assert (
        parse("pip install /path/to/tensor-runner", "x:10") is None and parse("runner report --out r/", "x:11") is None
    )


CLI_WORD = re.compile(r"\b(mlflow|runner) ")  # commands that serve or read the user's store: checked, not run


def cli_commands() -> list[tuple[str, str, list[str]]]:
    """`mlflow SUBCOMMAND --options` and `runner SUBCOMMAND --options` lines of the docs' code blocks, each once."""
    found: dict[tuple[str, ...], tuple[str, str, list[str]]] = {}
    for page in documentation_pages():
        in_block = False
        for number, line in enumerate(page.read_text().splitlines(), start=1):
            in_block = in_block != line.lstrip().startswith("```")
            try:
                tokens = _tokens(line.strip().removeprefix("$ ")) if in_block and CLI_WORD.search(line) else []
            except ValueError:  # not a shell line (an output, a yaml block)
                continue
            start = next((i for i, t in enumerate(tokens) if _is_cli(tokens, i)), None)
            if start is not None and start + 1 < len(tokens):
                tool, args = Path(tokens[start]).name, tokens[start + 1 :]
                found.setdefault((tool, *args), (f"{page.relative_to(PROJECT_ROOT)}:{number}", tool, args))
    return list(found.values())


def _is_cli(tokens: list[str], i: int) -> bool:
    """tokens[i] calls mlflow or runner: the word in a command's place (not in prose or a program's output)."""
    in_place = i == 0 or tokens[i - 1] in SEPARATORS or re.fullmatch(r"[A-Z_]+=.*", tokens[i - 1]) is not None
    return in_place and re.fullmatch(r"(.*/)?(mlflow|runner)", tokens[i]) is not None


@pytest.mark.parametrize(("source", "tool", "args"), cli_commands())
def test_documented_cli_command_has_those_options(source: str, tool: str, args: list[str]):
    """The subcommand exists and takes every option the docs give it (checked with --help)."""
    executable = Path(sys.executable).with_name(tool)
    result = subprocess.run([str(executable), args[0], "--help"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, f"{source}: {tool} {args[0]}: {result.stderr[-500:]}"
    for option in (arg.split("=")[0] for arg in args[1:] if arg.startswith("--")):
        assert option in result.stdout, f"{source}: {tool} {args[0]} has no option {option}"


def test_the_docs_print_the_cli_commands():
    """The README's MLflow UI, report and comparison commands are among those checked."""
    assert {(tool, args[0]) for _, tool, args in cli_commands()} >= {
        ("mlflow", "ui"),
        ("runner", "report"),
        ("runner", "compare"),
    }


def test_commands_run_by_other_tests_are_still_documented():
    """A command left to another test must still be one the docs print, as that test runs it."""
    from test_own_models import KERAS_README_SWEEP

    documented = {" ".join(c.args) for c in COMMANDS}
    assert set(RUN_BY_OTHER_TESTS) <= documented
    assert KERAS_README_SWEEP in RUN_BY_OTHER_TESTS

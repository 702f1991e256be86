"""model.weights= for model=llama with checkpoints as users have them (issue 63): Hugging Face folders that
transformers' save_pretrained writes for LlamaForCausalLM (its head tied and untied, Llama 3's rope scaling) and
Qwen2ForCausalLM (q, k, v biases), run as a user runs them and checked against transformers' own generate() on every
backend; and every way a checkpoint that does not fit is refused, in one line naming the file and the key."""

from __future__ import annotations

import copy
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest
from test_llama import _in_float64

from runner.config import PROJECT_ROOT, ConfigError, compose
from runner.measure.job import run_and_record
from runner.models.llama import Llama
from runner.record.naming import job_spec

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

FAST = ["timing.warmup_s=0", "timing.min_warmup_calls=1", "timing.min_repeats=2", "timing.max_time_s=0.05"]
FAST += ["timing.rounds=1", "tracking=none"]
NEW_TOKENS = 8
SIZES = {"num_hidden_layers": 2, "hidden_size": 32, "num_attention_heads": 4, "num_key_value_heads": 2,
         "intermediate_size": 48, "vocab_size": 64, "max_position_embeddings": 128}  # fmt: skip
RUN_SIZES = ["model.layers=2", "model.d_model=32", "model.heads=4", "model.kv_heads=2", "model.ffn=48",
             "model.vocab_size=64", "model.prompt_len=5"]  # fmt: skip
LLAMA3 = {"factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 64}
# The three checkpoints: (transformers' classes, config.json's settings beyond SIZES, the run's overrides that fit them)
FAMILIES = {
    "llama": (
        "LlamaConfig", "LlamaForCausalLM",
        {"rope_theta": 100.0, "rope_scaling": {"rope_type": "llama3", **LLAMA3}, "rms_norm_eps": 1e-5},
        ["model.rope_theta=100", "model.rope_scaling={" + ",".join(f"{k}:{v}" for k, v in LLAMA3.items()) + "}"],
    ),
    "llama_tied": (
        "LlamaConfig", "LlamaForCausalLM", {"rope_theta": 100.0, "rms_norm_eps": 1e-6, "tie_word_embeddings": True},
        ["model.rope_theta=100", "model.rms_eps=1e-6", "model.tie_embeddings=true"],
    ),
    "qwen2": (
        "Qwen2Config", "Qwen2ForCausalLM",
        {"rope_theta": 1000.0, "rms_norm_eps": 1e-6, "tie_word_embeddings": True},
        ["model.rope_theta=1000", "model.rms_eps=1e-6", "model.tie_embeddings=true", "model.qkv_bias=true"],
    ),
}  # fmt: skip


def hf_model(family: str, **changed):
    """transformers' model, seeded, its matrices 4 times larger (queries and keys 32 times: attention that tells
    positions apart), its norms and biases moved off their defaults: a randomly initialised Llama repeats a token;
    these vary, so that a wrong weight shows."""
    config_name, model_name, settings, _ = copy.deepcopy(FAMILIES[family])  # transformers changes rope_scaling
    config = getattr(transformers, config_name)(**{**SIZES, **settings, **changed}, bos_token_id=None,
                                                eos_token_id=None, pad_token_id=0)  # fmt: skip
    return distinct(getattr(transformers, model_name), config)


def distinct(model_class, config):
    """transformers' model of this config, seeded, its weights moved as `hf_model` says."""
    torch.manual_seed(0)
    model = model_class(config).eval()
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if name.endswith("norm.weight") or name.endswith(".bias"):
                parameter.add_(0.1 * torch.randn_like(parameter))
            else:
                parameter.mul_(32 if re.search(r"[qk]_proj", name) else 4)
    return model


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> dict[str, tuple]:
    """{family: (transformers' model, the folder its save_pretrained wrote)}."""
    root = tmp_path_factory.mktemp("llamas")
    made = {family: hf_model(family) for family in FAMILIES}
    for family, model in made.items():
        model.save_pretrained(root / family)
    return {family: (model, root / family) for family, model in made.items()}


def overrides(family: str) -> list[str]:
    return [*RUN_SIZES, *FAMILIES[family][3]]


def generate(tmp_path: Path, weights: Path, family: str, *more: str):
    cfg = compose([*FAST, "model=llama", "task=generate", f"task.new_tokens={NEW_TOKENS}", "batch_size=4",
                   f"model.weights={weights}", *overrides(family), *more])  # fmt: skip
    outcome = run_and_record(job_spec(cfg), tmp_path)
    assert outcome.status == "FINISHED", outcome.error
    with h5py.File(tmp_path / "tensors.h5") as f:
        return outcome, f["inputs/x"][()], f["outputs/tokens"][()], f["outputs/logits"][()]


# How far the runner's logits may be from transformers', over the largest logit. float32: two frameworks' float32 in
# their own orders, 5e-7 to 1.1e-5 over this file's and test_llama_configs.py's 65 cases (YaRN on TensorFlow the most,
# tied embeddings on JAX eager next: 8.8e-6), and at 1e-5 a fresh clone's CI failed one; a setting read wrong is held
# to 1e-9 by the float64 cases, and in float32 changes the tokens.
LOGITS_AGREE = {"float32": 1e-4, "float64": 1e-9}


def transformers_generation(model, prompt: np.ndarray, tokens: np.ndarray, dtype: str):
    """transformers' greedy tokens after `prompt`, and its logits at each step of the sequence the run wrote."""
    model = model.double() if dtype == "float64" else model.float()
    ids = torch.from_numpy(prompt)
    with torch.no_grad():
        greedy = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=NEW_TOKENS, do_sample=False)
        sequence = torch.from_numpy(np.concatenate([prompt, tokens[:, :-1]], axis=1))
        logits = model(sequence).logits[:, prompt.shape[1] - 1 :]
    model.float()
    return greedy[:, prompt.shape[1] :].numpy(), logits.numpy()


def _case(family: str, backend: str, mode: str, dtype: str = "float32", heavy: bool = False):
    return pytest.param(family, backend, mode, dtype, marks=[pytest.mark.heavy] * heavy,
                        id=f"{family}-{backend}-{mode}-{dtype}")  # fmt: skip


# Every backend eager and compiled, each checkpoint on several (reading it is the same for every backend: the default
# set runs four); torch.compile (~20 s on 2 cores), XLA, TensorFlow (~7 s) and the second
# mode of each backend run in the heavy set.
CASES = [
    _case("llama", "numpy", "eager", "float64"),
    _case("llama_tied", "torch", "eager"),
    _case("qwen2", "jax", "function"),
    _case("llama", "tensorflow", "function", heavy=True),
    _case("qwen2", "tnp", "eager"),
    _case("qwen2", "numpy", "eager", "float64", heavy=True),
    _case("llama_tied", "numpy", "eager", "float64", heavy=True),
    _case("llama", "torch", "eager", "float64", heavy=True),
    _case("qwen2", "torch", "function", heavy=True),
    _case("llama_tied", "jax", "eager", heavy=True),
    _case("llama", "jax", "xla", heavy=True),
    _case("llama_tied", "tensorflow", "eager", heavy=True),
    _case("qwen2", "tensorflow", "xla", heavy=True),
    _case("llama", "tnp", "function", heavy=True),
]


@pytest.mark.parametrize(("family", "backend", "mode", "dtype"), CASES)
def test_a_save_pretrained_folder_generates_transformers_tokens(
    tmp_path, checkpoints, monkeypatch, family, backend, mode, dtype
):
    """The runner's greedy tokens are transformers' generate()'s; its logits within float32's error of transformers'
    as it ships, and within 1e-9 in float64 of transformers' with its RMSNorm and rotary angles in float64 too."""
    model, folder = checkpoints[family]
    outcome, prompt, tokens, logits = generate(tmp_path, folder, family, f"backend={backend}", f"mode={mode}",
                                               f"dtype={dtype}")  # fmt: skip
    assert outcome.metrics["tokens_differ"] == 0
    if dtype == "float64":
        _in_float64(model, Llama(rope_theta=model.config.rope_parameters["rope_theta"],
                                 rope_scaling=LLAMA3 if family == "llama" else None, d_model=32, heads=4),
                    torch, monkeypatch)  # fmt: skip
    greedy, expected = transformers_generation(model, prompt, tokens, dtype)
    np.testing.assert_array_equal(tokens, greedy)
    assert len(np.unique(tokens)) > 3  # tokens that vary: a wrong weight would show
    error = np.abs(logits - expected).max() / np.abs(expected).max()
    assert error < LOGITS_AGREE[dtype], error


def test_names_are_read_once_for_every_backend_under_transformers_names(checkpoints, tmp_path):
    """The folder, and the same state dict as a single file with the head tied and saved as a copy of its own: the
    weights of transformers' state dict, `model.` stripped, in the spec's order."""
    from safetensors.torch import save_file

    model, folder = checkpoints["llama_tied"]
    llama = Llama(layers=2, d_model=32, heads=4, kv_heads=2, ffn=48, vocab_size=64, rope_theta=100.0, rms_eps=1e-6,
                  tie_embeddings=True)  # fmt: skip
    state = model.state_dict()
    assert "lm_head.weight" in state and state["lm_head.weight"] is not None
    save_file({k: v.clone() for k, v in state.items()}, str(tmp_path / "state.safetensors"))
    for source in (folder, tmp_path / "state.safetensors"):
        loaded = llama.read_weights(source)
        assert list(loaded) == list(llama.spec)
        for name, value in loaded.items():
            np.testing.assert_array_equal(value, state["model." + name].numpy(), err_msg=f"{source}: {name}")


# -- refusals: one line naming the file and the key, and a run that fails ----------------------------------------------


def refusal(source: Path, family: str, tmp_path: Path, *more: str) -> str:
    """The one line a run refuses the checkpoint with; the run fails with that line as its error."""
    cfg = compose([*FAST, "model=llama", "task=generate", "backend=numpy", f"model.weights={source}",
                   *overrides(family), *more])  # fmt: skip
    outcome = run_and_record(job_spec(cfg), tmp_path / "run")
    assert outcome.status == "FAILED"
    line = outcome.error
    assert "\n" not in line and str(source) in line
    return line


def folder_with(tmp_path: Path, name: str, state: dict, config: Path) -> Path:
    """A folder of these tensors (model.safetensors) beside a copy of config.json."""
    from safetensors.torch import save_file

    folder = tmp_path / name
    folder.mkdir()
    save_file({k: v.contiguous().clone() for k, v in state.items()}, str(folder / "model.safetensors"))
    (folder / "config.json").write_text(config.read_text())
    return folder


def test_a_key_of_no_use_is_refused(tmp_path, checkpoints):
    model, folder = checkpoints["llama"]
    stray = folder_with(tmp_path, "stray", {**model.state_dict(), "score.weight": torch.zeros(2, 32)},
                        folder / "config.json")  # fmt: skip
    assert refusal(stray, "llama", tmp_path) == (
        f"{stray}/model.safetensors holds 1 tensor model=llama does not use (score.weight): refused rather than "
        "dropped (a checkpoint of other sizes or another model?)"
    )


def test_a_missing_weight_is_refused(tmp_path, checkpoints):
    model, folder = checkpoints["qwen2"]
    state = {k: v for k, v in model.state_dict().items() if k != "model.layers.1.self_attn.k_proj.bias"}
    lacking = folder_with(tmp_path, "lacking", state, folder / "config.json")
    assert refusal(lacking, "qwen2", tmp_path) == (
        f"{lacking}/model.safetensors lacks 1 of the 26 weights model=llama needs, e.g. layers.1.self_attn.k_proj.bias "
        "(looked up under the prefix model.)"
    )


def test_a_shape_that_disagrees_is_refused(tmp_path, checkpoints):
    """A single file has no config.json: its shapes are what is checked (here an MLP of 40 features, the run's 48)."""
    from safetensors.torch import save_file

    narrower = tmp_path / "narrower.safetensors"
    save_file(hf_model("llama", intermediate_size=40).state_dict(), str(narrower))
    assert refusal(narrower, "llama", tmp_path) == (
        f"{narrower}: model.layers.0.mlp.gate_proj.weight has shape (40, 32), model=llama needs (48, 32)"
    )


def test_an_untied_head_is_refused_where_the_run_ties_it(tmp_path, checkpoints):
    model, folder = checkpoints["llama"]
    config = json.loads((folder / "config.json").read_text())
    assert refusal(folder, "llama", tmp_path, "model.tie_embeddings=true") == (
        f"{folder}/config.json sets tie_word_embeddings=false, this run model.tie_embeddings=true: run with "
        "model.tie_embeddings=false"
    )
    state = dict(model.state_dict())
    (tmp_path / "config.json").write_text(json.dumps({**config, "tie_word_embeddings": True}))
    untied = folder_with(tmp_path, "untied", state, tmp_path / "config.json")
    assert refusal(untied, "llama", tmp_path, "model.tie_embeddings=true") == (
        f"{untied}/model.safetensors: lm_head.weight differs from model.embed_tokens.weight: an untied head, which "
        "model=llama cannot hold (its head is embed_tokens.weight, tied)"
    )


def test_a_config_of_other_sizes_is_one_line_with_the_settings_that_fit(tmp_path, checkpoints):
    """Composed without Hydra's overrides (as a test composes), a setting away from model=llama's defaults is the
    run's own: one that disagrees with config.json is refused when the run reads the folder; the rest are config.json's.
    """
    _, folder = checkpoints["qwen2"]
    assert refusal(folder, "qwen2", tmp_path, "model.kv_heads=4", "model.rms_eps=1e-4") == (
        f"{folder}/config.json sets num_key_value_heads=2, rms_norm_eps=1e-06, this run model.kv_heads=4, "
        "model.rms_eps=0.0001: run with model.kv_heads=2 model.rms_eps=1e-06"
    )
    _, folder = checkpoints["llama"]
    assert refusal(folder, "llama", tmp_path, "model.context=256") == (
        f"{folder}/config.json: max_position_embeddings=128, but model.context=256: positions past 128 are beyond "
        "what the checkpoint was trained for; run with model.context=128 or less"
    )
    assert refusal(folder, "llama", tmp_path, "model.rope_theta=400", "model.rope_scaling=null") == (
        f"{folder}/config.json sets rope_parameters.rope_theta=100.0, this run model.rope_theta=400.0: run with "
        "model.rope_theta=100.0"
    )


def test_a_config_of_other_arithmetic_is_refused(tmp_path, checkpoints):
    _, folder = checkpoints["llama"]
    config = json.loads((folder / "config.json").read_text())
    cases = {
        "model_type": ("gemma", "model_type=gemma, not a Llama, Qwen2, Qwen3 or Mistral that model=llama runs"),
        "hidden_act": ("gelu", "hidden_act='gelu', but model=llama computes a SiLU-gated MLP"),
        "partial_rotary_factor": (0.5, "partial_rotary_factor=0.5, but model=llama turns every feature of a head"),
        "rope_parameters": (
            {"rope_type": "longrope", "rope_theta": 100.0, "factor": 4.0},
            "rope_parameters.rope_type=longrope, but model=llama computes rotary embeddings without scaling "
            "(default) or with llama3, linear, dynamic, yarn scaling",
        ),
    }
    other = tmp_path / "other"
    other.mkdir()
    for key, (value, said) in cases.items():
        (other / "model.safetensors").write_bytes((folder / "model.safetensors").read_bytes())
        (other / "config.json").write_text(json.dumps({**config, key: value}))
        with pytest.raises(ConfigError) as error:
            Llama(layers=2, d_model=32, heads=4, kv_heads=2, ffn=48, vocab_size=64, rope_theta=100.0,
                  rope_scaling=LLAMA3).read_weights(other)  # fmt: skip
        assert str(error.value) == f"{other}/config.json: {said}", key


def test_a_legacy_config_with_rope_theta_and_rope_scaling_is_read(tmp_path, checkpoints):
    """Hub checkpoints written before transformers 5 keep rope_theta and rope_scaling at the top of config.json."""
    model, folder = checkpoints["llama"]
    config = json.loads((folder / "config.json").read_text())
    rope = config.pop("rope_parameters")
    legacy = {**config, "rope_theta": rope.pop("rope_theta"), "rope_scaling": {**rope, "type": rope.pop("rope_type")}}
    (tmp_path / "config.json").write_text(json.dumps(legacy))
    old = folder_with(tmp_path, "legacy", dict(model.state_dict()), tmp_path / "config.json")
    llama = Llama(layers=2, d_model=32, heads=4, kv_heads=2, ffn=48, vocab_size=64, rope_theta=100.0,
                  rope_scaling=LLAMA3)  # fmt: skip
    assert list(llama.read_weights(old)) == list(llama.spec)
    with pytest.raises(ConfigError, match=r"sets rope_theta=100.0, this run model.rope_theta=500000.0"):
        Llama(layers=2, d_model=32, heads=4, kv_heads=2, ffn=48, vocab_size=64, rope_scaling=LLAMA3).read_weights(old)


@pytest.mark.heavy  # a fresh interpreter importing the runner and MLflow (~10 s on 2 cores)
def test_a_refused_checkpoint_exits_non_zero_with_its_one_line(tmp_path, checkpoints):
    from helpers import FAST_TIMING, run_cli

    _, folder = checkpoints["llama_tied"]
    out = run_cli("model=llama", "task=generate", "backend=numpy", f"model.weights={folder}", *RUN_SIZES,
                  "model.ffn=64", "tracking=none", f"hydra.run.dir={tmp_path}/run", *FAST_TIMING)  # fmt: skip
    assert out.returncode != 0
    said = f"{folder}/config.json sets intermediate_size=48, "
    assert sum(line.count(said) for line in out.stderr.splitlines()) >= 1, out.stderr[-3000:]


# -- the documented commands ---------------------------------------------------------------------------------------


def documented_lines() -> list[str]:
    """The code block of docs/generation.md's section on Llama and Qwen checkpoints, line by line."""
    page = (PROJECT_ROOT / "docs" / "generation.md").read_text()
    section = page.split("## A Llama or Qwen checkpoint from Hugging Face", 1)[1]
    return re.search(r"```bash\n(.*?)```", section, re.S).group(1).splitlines()


def _as_run(line: str) -> list[str]:
    args = shlex.split(line)
    assert args[0] == "python"
    return [sys.executable, *(str(PROJECT_ROOT / a) if a == "run.py" else a for a in args[1:])]


@pytest.mark.heavy  # fresh interpreters importing transformers and torch, and the runner and MLflow (~40 s)
def test_the_documented_commands_run_as_printed(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(PROJECT_ROOT / "src"), "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path}/m.db"}
    caps = ["timing.warmup_s=0", "timing.min_repeats=1", "timing.max_time_s=0.001"]
    runs = 0
    for line in documented_lines():
        run_dir = [f"hydra.run.dir={tmp_path}/run{runs}"] if "run.py" in line else []
        command = _as_run(line) + (caps + run_dir if "run.py" in line else [])
        done = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-3000:]
        if "run.py" in line:
            saved = json.loads((tmp_path / f"run{runs}" / "result.json").read_text())
            assert saved["status"] == "FINISHED" and saved["metrics"]["tokens_differ"] == 0, line
            runs += 1
    assert runs == sum("run.py" in line for line in documented_lines()) == 4

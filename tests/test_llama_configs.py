"""A checkpoint describes its model (issue 76): with `model=llama model.weights=FOLDER`, the folder's config.json sets
the model's settings as transformers' from_pretrained reads them (its documented defaults where a key is left out),
for LlamaConfig, Qwen2Config, Qwen3Config and MistralConfig folders written by save_pretrained with their defaults at
small sizes, and for the variants people run (an explicit head_dim, attention and MLP biases, linear, dynamic and YaRN
rope scaling, Qwen3's q/k norm, Mistral's and Qwen2's sliding window): the greedy tokens are transformers' generate()'s
on every backend, and the float64 logits within 1e-9 of its float64 forward. A setting typed on the command line that
disagrees is refused in one line before anything runs; a sliding window the sequence passes is computed (Mistral's in
every layer, Qwen2's after its max_window_layers); a weights file without config.json says what could not be
checked."""

from __future__ import annotations

import json
from pathlib import Path

import h5py
import numpy as np
import pytest
import yaml
from test_llama import _in_float64
from test_llama_checkpoints import FAST, LOGITS_AGREE, NEW_TOKENS, distinct, transformers_generation

from runner.config import CONFIG_DIR, compose
from runner.launch import preflight
from runner.measure.job import run_and_record
from runner.models import build_workload
from runner.models.llama import Llama
from runner.models.llama_checkpoint import COMMON, FAMILIES
from runner.record.naming import job_spec

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

SMALL = {"num_hidden_layers": 2, "hidden_size": 32, "num_attention_heads": 4, "num_key_value_heads": 2,
         "intermediate_size": 48, "vocab_size": 64}  # fmt: skip
CLASSES = {"llama": "Llama", "qwen2": "Qwen2", "qwen3": "Qwen3", "mistral": "Mistral"}
# name: (family, config.json's settings beyond SMALL and the family's defaults)
VARIANTS = {
    "llama": ("llama", {}),
    "qwen2": ("qwen2", {}),
    "qwen3": ("qwen3", {}),  # q/k RMSNorm, and Qwen3Config's head_dim of 128 at d_model 32
    "mistral": ("mistral", {}),  # its 4096-position window, which 24 tokens fit
    "head_dim": ("llama", {"head_dim": 16}),
    "biases": ("llama", {"attention_bias": True, "mlp_bias": True}),
    "linear": ("llama", {"rope_parameters": {"rope_type": "linear", "factor": 4.0, "rope_theta": 100.0}}),
    "dynamic": ("llama", {"rope_parameters": {"rope_type": "dynamic", "factor": 4.0, "rope_theta": 100.0}}),
    "yarn": (
        "llama",
        {
            "rope_parameters": {
                "rope_type": "yarn",
                "factor": 4.0,
                "rope_theta": 100.0,
                "original_max_position_embeddings": 8,
            }
        },
    ),  # fmt: skip
    "qwen2_window": ("qwen2", {"use_sliding_window": True, "sliding_window": 32, "max_window_layers": 1}),
    "mistral_window": ("mistral", {"sliding_window": 8}),  # 24 tokens: the window bites
    "qwen2_window_bites": ("qwen2", {"use_sliding_window": True, "sliding_window": 8, "max_window_layers": 1}),
}


def save(root: Path, name: str, **changed) -> tuple[object, Path]:
    """transformers' model of the variant (its config class's defaults but SMALL's sizes), saved by save_pretrained;
    its generate() told no end-of-text token, so that it writes as many tokens as the run."""
    family, settings = VARIANTS[name]
    config = getattr(transformers, f"{CLASSES[family]}Config")(**{**SMALL, **settings, **changed})
    model = distinct(getattr(transformers, f"{CLASSES[family]}ForCausalLM"), config)
    model.save_pretrained(root / name)
    model.generation_config.eos_token_id, model.generation_config.pad_token_id = None, 0
    return model, root / name


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, tuple]:
    root = tmp_path_factory.mktemp("described")
    return {name: save(root, name) for name in VARIANTS}


def run(tmp_path: Path, folder: Path, *more: str):
    """`model=llama model.weights=FOLDER` and nothing else of the model: the spec, the outcome and the tensors."""
    cfg = compose([*FAST, "model=llama", "task=generate", f"task.new_tokens={NEW_TOKENS}", "batch_size=4",
                   f"model.weights={folder}", *more])  # fmt: skip
    spec = job_spec(cfg)
    outcome = run_and_record(spec, tmp_path)
    assert outcome.status == "FINISHED", outcome.error
    with h5py.File(tmp_path / "tensors.h5") as f:
        return spec, outcome, f["inputs/x"][()], f["outputs/tokens"][()], f["outputs/logits"][()]


def in_float64(hf, llama: Llama, monkeypatch) -> None:
    """test_llama's float64 RMSNorm and rotary angles, the angles scaled by YaRN's attention factor where it has one."""
    _in_float64(hf, llama, torch, monkeypatch)
    plain = hf.model.rotary_emb.forward

    def rotary(x, position_ids):
        cos, sin = plain(x, position_ids)
        return cos * llama.attention_factor, sin * llama.attention_factor

    monkeypatch.setattr(hf.model.rotary_emb, "forward", rotary)


def _case(name: str, backend: str, mode: str, dtype: str = "float32", heavy: bool = False):
    return pytest.param(name, backend, mode, dtype, marks=[pytest.mark.heavy] * heavy,
                        id=f"{name}-{backend}-{mode}-{dtype}")  # fmt: skip


ELSEWHERE = [("torch", "eager"), ("tensorflow", "function"), ("tnp", "eager"), ("jax", "xla")]
CASES = [_case(name, "numpy", "eager", "float64") for name in VARIANTS]
CASES += [_case("qwen3", "torch", "eager"), _case("mistral", "jax", "function")]
CASES += [
    _case(name, b, m, heavy=True)
    for name in VARIANTS
    for b, m in ELSEWHERE
    if (name, b, m) != ("qwen3", "torch", "eager")
]
CASES += [_case("qwen3", "torch", "function", heavy=True)]  # torch.compile: ~29 s on 2 cores
CASES += [_case(name, "torch", "eager", "float64", heavy=True) for name in ("qwen3", "yarn", "biases")]
COMPILED = [("yarn", "torch", "function"), ("qwen3", "tnp", "function"), ("biases", "jax", "eager"),
            ("qwen2_window", "tensorflow", "xla"), ("head_dim", "jax", "function")]  # fmt: skip
CASES += [_case(name, backend, mode, heavy=True) for name, backend, mode in COMPILED]


@pytest.mark.parametrize(("name", "backend", "mode", "dtype"), CASES)
def test_a_folder_describes_its_model(tmp_path, folders, monkeypatch, name, backend, mode, dtype):
    model, folder = folders[name]
    spec, outcome, prompt, tokens, logits = run(tmp_path, folder, f"backend={backend}", f"mode={mode}",
                                                f"dtype={dtype}")  # fmt: skip
    assert outcome.metrics["tokens_differ"] == 0
    llama = build_workload(spec.model_settings)
    if dtype == "float64":
        in_float64(model, llama, monkeypatch)
    greedy, expected = transformers_generation(model, prompt, tokens, dtype)
    np.testing.assert_array_equal(tokens, greedy)
    assert len(np.unique(tokens)) > 3  # tokens that vary: a wrong weight would show
    error = np.abs(logits - expected).max() / np.abs(expected).max()
    assert error < LOGITS_AGREE[dtype], error


def test_the_record_keeps_config_jsons_settings(tmp_path, folders):
    """result.json's config holds what config.json set (Qwen3's head_dim and q/k norm, its rope base, its 32768
    positions), and its environment says where they came from."""
    _, folder = folders["qwen3"]
    run(tmp_path, folder, "backend=numpy", "task.new_tokens=2")
    saved = json.loads((tmp_path / "result.json").read_text())
    model = saved["config"]["model"]
    expected = {"layers": 2, "d_model": 32, "heads": 4, "kv_heads": 2, "ffn": 48, "vocab_size": 64, "head_dim": 128,
                "qk_norm": True, "qkv_bias": False, "rope_theta": 10000.0, "rms_eps": 1e-6, "context": 32768,
                "sliding_window": None, "tie_embeddings": False}  # fmt: skip
    assert {k: model[k] for k in expected} == expected
    assert saved["environment"]["model_settings"] == f"from {folder}/config.json (model.* typed agree with it)"


def test_a_typed_setting_that_disagrees_is_refused_before_anything_runs(tmp_path, folders):
    """model.ffn=128 and model.rms_eps=1e-5 are model=llama's defaults, typed: the run's own, so they are refused
    against config.json's 48 and 1e-6 (as the command line's preflight refuses them: exit 2, nothing imported)."""
    _, folder = folders["llama"]
    argv = ["model=llama", "task=generate", "backend=numpy", f"model.weights={folder}", "model.ffn=128",
            "model.rms_eps=1e-5", "model.layers=2", "tracking=none", f"hydra.run.dir={tmp_path}/run"]  # fmt: skip
    with pytest.raises(preflight.BadInput) as refused:
        preflight.check(argv)
    assert str(refused.value) == (
        f"{folder}/config.json sets intermediate_size=48, rms_norm_eps=1e-06, this run model.ffn=128, "
        "model.rms_eps=1e-05: run with model.ffn=48 model.rms_eps=1e-06"
    )
    assert preflight.check([a for a in argv if "ffn" not in a and "rms_eps" not in a]) is not None


def test_a_job_that_cannot_take_its_checkpoint_is_refused_when_it_runs(tmp_path, folders):
    """Reading a job's spec (a sweep's launcher does, job by job) never raises: the job itself refuses, recorded."""
    _, folder = folders["llama"]
    cfg = compose([*FAST, "model=llama", "task=generate", "backend=numpy", f"model.weights={folder}",
                   "model.rope_scaling=8"])  # fmt: skip
    outcome = run_and_record(job_spec(cfg), tmp_path / "run")
    assert outcome.status == "FAILED"
    assert outcome.error == "model.rope_scaling=8 must be null or a mapping with a rope_type and its settings"


def test_sliding_attention_between_full_attention_layers_is_refused_in_one_line(tmp_path):
    _, folder = save(tmp_path, "qwen2_window_bites")
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "layer_types": ["sliding_attention", "full_attention"]}))
    cfg = compose([*FAST, "model=llama", "task=generate", "backend=numpy", f"model.weights={folder}"])
    outcome = run_and_record(job_spec(cfg), tmp_path / "run")
    assert outcome.status == "FAILED"
    assert outcome.error == (
        f"{folder}/config.json: layer_types interleave full and sliding attention, but model=llama computes full "
        "attention in the first layers and sliding attention in every layer after them"
    )


def test_a_bare_weights_file_says_what_it_could_not_check(tmp_path, folders):
    from safetensors.torch import save_file

    model, _ = folders["llama"]
    bare = tmp_path / "bare.safetensors"
    save_file(dict(model.state_dict()), str(bare))
    sizes = ["model.layers=2", "model.d_model=32", "model.heads=4", "model.kv_heads=2", "model.ffn=48",
             "model.vocab_size=64"]  # fmt: skip
    _, outcome, *_ = run(tmp_path / "run", bare, "backend=numpy", "task.new_tokens=2", *sizes)
    said = (
        f"model.weights={bare} has no config.json: the heads (model.heads=4, kv_heads=2, head size 8), rope "
        "(model.rope_theta=500000.0, rope_scaling=null) and norm (model.rms_eps=1e-05) settings are this run's own "
        "and could not be checked against the weights (their shapes were)"
    )
    saved = json.loads((tmp_path / "run" / "result.json").read_text())
    assert said in saved["warnings"]
    assert saved["environment"]["model_settings"] == said


@pytest.mark.parametrize("family", list(FAMILIES))
def test_the_defaults_taken_are_transformers_documented_ones(family):
    config = getattr(transformers, f"{CLASSES[family]}Config")().to_dict()
    config["rope_theta"] = config["rope_parameters"]["rope_theta"]
    ours = {**COMMON, **FAMILIES[family]}
    for key, value in ours.items():
        if key in config and not (key == "sliding_window" and family != "mistral"):
            assert config[key] == value, key
    assert config.get("num_key_value_heads") == ours.get("num_key_value_heads", config["num_attention_heads"])


def test_model_llamas_yaml_is_its_constructors_defaults():
    """What a run leaves at model=llama's yaml is config.json's to set: the yaml and Llama's defaults are one."""
    import inspect

    settings = yaml.safe_load((CONFIG_DIR / "model" / "llama.yaml").read_text())
    defaults = {k: p.default for k, p in inspect.signature(Llama).parameters.items()}
    assert {k: settings[k] for k in defaults} == defaults

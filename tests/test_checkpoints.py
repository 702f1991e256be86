"""model.weights= for model=gpt2 with checkpoints as users have them (issue 63): Hugging Face folders written by
transformers' save_pretrained (safetensors, a torch .bin, shards, bfloat16) and single files told by their content,
generated from and checked against transformers' own GPT-2 (an independent implementation); and every way a checkpoint
that does not fit is refused, in one line naming the file and the key."""

from __future__ import annotations

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

from runner.config import PROJECT_ROOT, ConfigError, compose
from runner.measure.job import run_and_record
from runner.models.decoder import Decoder
from runner.record.naming import job_spec

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

SIZES = {"n_layer": 2, "n_embd": 64, "n_head": 4, "vocab_size": 512, "n_positions": 128}  # model=gpt2's defaults
FAST = ["timing.warmup_s=0", "timing.min_warmup_calls=1", "timing.min_repeats=2", "timing.max_time_s=0.05"]
FAST += ["timing.rounds=1", "tracking=none"]
NEW_TOKENS = 8


def gpt2(**sizes: int):
    """transformers' GPT2LMHeadModel, seeded, with its position embedding 10 times larger: a randomly initialised
    GPT-2 repeats its prompt's last token; with positions that count the tokens vary, so that a wrong weight shows."""
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config(**{**SIZES, **sizes})).eval()
    with torch.no_grad():
        model.transformer.wpe.weight *= 10
    return model


def save(model, folder: Path, **kwargs) -> Path:
    model.save_pretrained(folder, **kwargs)
    return folder


def legacy_bin_folder(model, folder: Path) -> Path:
    """A folder as older transformers and the hub's GPT-2 have it: config.json and a torch pytorch_model.bin of
    GPT2Model's names (no prefix, no head) with each layer's causal-mask buffers beside the weights."""
    model.config.save_pretrained(folder)
    state = {k.removeprefix("transformer."): v for k, v in model.state_dict().items() if k != "lm_head.weight"}
    for i in range(model.config.n_layer):
        n = model.config.n_positions
        state[f"h.{i}.attn.bias"] = torch.tril(torch.ones(n, n, dtype=torch.uint8)).view(1, 1, n, n)
        state[f"h.{i}.attn.masked_bias"] = torch.tensor(-1e4)
    torch.save(state, folder / "pytorch_model.bin")
    return folder


def bin_shards(model, folder: Path) -> Path:
    """A folder of two torch shards and pytorch_model.bin.index.json, as older transformers sharded a large model."""
    model.config.save_pretrained(folder)
    state = model.state_dict()
    halves = {f"pytorch_model-0000{i + 1}-of-00002.bin": list(state)[i::2] for i in range(2)}
    for shard, keys in halves.items():
        torch.save({k: state[k] for k in keys}, folder / shard)
    weight_map = {k: shard for shard, keys in halves.items() for k in keys}
    (folder / "pytorch_model.bin.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return folder


def state_file(state: dict, path: Path) -> Path:
    """A single safetensors file of these tensors (under whatever name); a tied head saved as a copy of its own."""
    from safetensors.torch import save_file

    save_file({k: v.clone() for k, v in state.items()}, str(path))
    return path


@pytest.fixture(scope="module")
def model():
    return gpt2()


@pytest.fixture(scope="module")
def folders(model, tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("checkpoints")
    return {
        "safetensors": save(model, root / "safetensors"),
        "bin": legacy_bin_folder(model, root / "bin"),
        "sharded": save(model, root / "sharded", max_shard_size="100KB"),
    }


def generate(tmp_path: Path, weights: Path, *overrides: str):
    cfg = compose([*FAST, "model=gpt2", "task=generate", f"task.new_tokens={NEW_TOKENS}", "batch_size=2",
                   f"model.weights={weights}", *overrides])  # fmt: skip
    outcome = run_and_record(job_spec(cfg), tmp_path)
    with h5py.File(tmp_path / "tensors.h5") as f:
        return outcome, f["inputs/x"][()], f["outputs/tokens"][()], f["outputs/logits"][()]


def transformers_generation(model, prompt: np.ndarray, tokens: np.ndarray, dtype: str):
    """transformers' greedy tokens after `prompt`, and its logits at each step of the sequence the run wrote."""
    model = model.double() if dtype == "float64" else model.float()
    ids = torch.from_numpy(prompt)
    with torch.no_grad():
        greedy = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=NEW_TOKENS, do_sample=False,
                                pad_token_id=0)  # fmt: skip
        sequence = torch.from_numpy(np.concatenate([prompt, tokens[:, :-1]], axis=1))
        logits = model(sequence).logits[:, prompt.shape[1] - 1 :]
    model.float()
    return greedy[:, prompt.shape[1] :].numpy(), logits.numpy()


@pytest.mark.parametrize(
    ("layout", "backend", "dtype"),
    [("safetensors", "numpy", "float64"), ("safetensors", "torch", "float32"), ("bin", "numpy", "float64")],
)
def test_a_save_pretrained_folder_generates_transformers_tokens(tmp_path, model, folders, layout, backend, dtype):
    outcome, prompt, tokens, logits = generate(tmp_path, folders[layout], f"backend={backend}", f"dtype={dtype}")
    assert outcome.status == "FINISHED", outcome.error
    greedy, expected = transformers_generation(model, prompt, tokens, dtype)
    np.testing.assert_array_equal(tokens, greedy)
    assert len(np.unique(tokens)) > 3  # tokens that vary: a wrong weight would show
    error = np.abs(logits - expected).max() / np.abs(expected).max()
    assert error < {"float32": 1e-5, "float64": 1e-9}[dtype], error


def test_every_layout_and_file_format_gives_the_same_weights(tmp_path, model, folders):
    """Shards, a torch .bin, a state dict with the `transformer.` prefix and its tied head, and files under names
    that lie about their format (told by content): the same weights as the safetensors folder."""
    decoder = Decoder()
    expected = decoder.read_weights(folders["safetensors"])
    state = model.state_dict()  # transformer.* and lm_head.weight, equal to wte: accepted
    torch.save(state, tmp_path / "state.safetensors")  # a torch zip named .safetensors
    torch.save(state, tmp_path / "legacy.h5", _use_new_zipfile_serialization=False)  # torch's legacy pickle
    state_file(state, tmp_path / "weights.pth")  # safetensors named .pth
    with h5py.File(tmp_path / "weights.bin", "w") as f:  # HDF5 named .bin
        for name, value in expected.items():
            f[name] = value
    sources = [folders["sharded"], folders["bin"], bin_shards(model, tmp_path / "bin-shards")]
    sources += [tmp_path / n for n in ("state.safetensors", "legacy.h5")]
    sources += [tmp_path / "weights.pth", tmp_path / "weights.bin"]
    assert len(list(folders["sharded"].glob("model-*.safetensors"))) > 1
    for source in sources:
        loaded = decoder.read_weights(source)
        assert list(loaded) == list(expected), source
        for name, value in expected.items():
            np.testing.assert_array_equal(loaded[name], value, err_msg=f"{source}: {name}")


def test_bfloat16_tensors_are_widened_to_float32(tmp_path, model):
    folder = save(gpt2().to(torch.bfloat16), tmp_path / "bf16")
    loaded = Decoder().read_weights(folder)
    wte = model.transformer.wte.weight.detach().to(torch.bfloat16).float().numpy()
    np.testing.assert_array_equal(loaded["wte.weight"], wte)


def refusal(source: Path, decoder: Decoder | None = None) -> str:
    with pytest.raises(ConfigError) as error:
        (decoder or Decoder()).read_weights(source)
    line = str(error.value)
    assert "\n" not in line and str(source) in line
    return line


def test_a_folders_sizes_must_be_the_runs_and_a_run_says_so_in_one_line(tmp_path):
    folder = save(gpt2(n_layer=3, n_embd=32), tmp_path / "other")
    assert refusal(folder) == (
        f"{folder}/config.json sets n_layer=3, n_embd=32, this run model.layers=2, model.d_model=64: run with "
        "model.layers=3 model.d_model=32"
    )
    cfg = compose([*FAST, "model=gpt2", "task=generate", f"model.weights={folder}", "backend=numpy"])
    outcome = run_and_record(job_spec(cfg), tmp_path / "run")
    assert outcome.status == "FAILED" and outcome.error == refusal(folder)
    assert Decoder(layers=3, d_model=32).read_weights(folder)["h.2.ln_1.weight"].shape == (32,)


def test_a_lone_file_of_more_layers_or_other_widths_is_refused(tmp_path):
    deeper = state_file(gpt2(n_layer=3).state_dict(), tmp_path / "deeper.safetensors")
    assert refusal(deeper) == (
        f"{deeper} holds 12 tensors model=gpt2 does not use (transformer.h.2.attn.c_attn.bias, "
        "transformer.h.2.attn.c_attn.weight, transformer.h.2.attn.c_proj.bias, ...): refused rather than dropped "
        "(a checkpoint of other sizes or another model?)"
    )
    narrower = state_file(gpt2(n_embd=32).state_dict(), tmp_path / "narrower.safetensors")
    assert refusal(narrower) == (f"{narrower}: transformer.wte.weight has shape (512, 32), model=gpt2 needs (512, 64)")


def test_a_missing_weight_and_an_unknown_prefix_are_named(tmp_path, model):
    state = dict(model.state_dict())
    del state["transformer.h.1.mlp.c_fc.bias"]
    lacking = state_file(state, tmp_path / "lacking.safetensors")
    assert refusal(lacking) == (
        f"{lacking} lacks 1 of the 28 weights model=gpt2 needs, e.g. h.1.mlp.c_fc.bias (looked up under the prefix "
        "transformer.)"
    )
    wrapped = state_file({f"module.{k}": v for k, v in model.state_dict().items()}, tmp_path / "wrapped.safetensors")
    assert refusal(wrapped) == (
        f"{wrapped} lacks 28 of the 28 weights model=gpt2 needs, e.g. wte.weight, wpe.weight, h.0.ln_1.weight; it "
        "has module.transformer.wte.weight: a prefix the runner does not strip (it strips transformer. or model.)"
    )


def test_an_untied_head_is_refused_and_a_stray_key_too(tmp_path, model):
    state = dict(model.state_dict())
    state["lm_head.weight"] = state["lm_head.weight"].clone() + 1  # GPT-2 ties it: this head would be dropped
    untied = state_file(state, tmp_path / "untied.safetensors")
    assert refusal(untied) == (
        f"{untied}: lm_head.weight differs from transformer.wte.weight: an untied head, which model=gpt2 cannot hold "
        "(its head is wte.weight, tied)"
    )
    stray = state_file({**model.state_dict(), "score.weight": torch.zeros(2, 64)}, tmp_path / "stray.safetensors")
    assert refusal(stray).startswith(f"{stray} holds 1 tensor model=gpt2 does not use (score.weight)")


def test_files_and_folders_that_are_no_checkpoint_are_one_line(tmp_path, folders):
    (tmp_path / "notes.safetensors").write_text("not a checkpoint at all")
    assert refusal(tmp_path / "notes.safetensors") == (
        f"cannot read weights file {tmp_path}/notes.safetensors: not a torch (zip or pickle), safetensors or HDF5 "
        "file (it starts with b'not a ch')"
    )
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "tf_model.h5").write_bytes(b"")
    assert refusal(tmp_path / "empty") == (
        f"{tmp_path}/empty is a folder without a Hugging Face checkpoint (model.safetensors, "
        "model.safetensors.index.json, pytorch_model.bin, pytorch_model.bin.index.json): it holds tf_model.h5"
    )
    other = save(gpt2(), tmp_path / "relu")
    config = json.loads((other / "config.json").read_text())
    (other / "config.json").write_text(json.dumps({**config, "activation_function": "relu"}))
    assert refusal(other) == (
        f"{other}/config.json: activation_function='relu', but model=gpt2 computes GPT-2's tanh GELU (gelu_new)"
    )
    (other / "config.json").write_text(json.dumps({**config, "model_type": "llama"}))
    assert refusal(other) == f"{other}/config.json: model_type=llama, not a GPT-2 that model=gpt2 runs"


# -- the documented commands, and keras_hub's GPT-2 from the same folder --------------------------------------------


def documented_lines() -> list[str]:
    """The code block of docs/generation.md's section on Hugging Face checkpoints, line by line."""
    page = (PROJECT_ROOT / "docs" / "generation.md").read_text()
    section = page.split("## Weights from a Hugging Face checkpoint", 1)[1]
    return re.search(r"```bash\n(.*?)```", section, re.S).group(1).splitlines()


def _as_run(line: str) -> list[str]:
    args = shlex.split(line)
    assert args[0] == "python"
    return [sys.executable, *(str(PROJECT_ROOT / a) if a == "run.py" else a for a in args[1:])]


@pytest.mark.heavy  # two fresh interpreters, one importing transformers and torch, one the runner and MLflow (~25 s)
def test_the_documented_command_runs_as_printed(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(PROJECT_ROOT / "src"), "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path}/m.db"}
    caps = ["timing.warmup_s=0", "timing.min_repeats=1", "timing.max_time_s=0.001", f"hydra.run.dir={tmp_path}/run"]
    for line in documented_lines():
        command = _as_run(line) + (caps if "run.py" in line else [])
        done = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-3000:]
    saved = json.loads((tmp_path / "run" / "result.json").read_text())
    assert saved["status"] == "FINISHED" and saved["metrics"]["tokens_differ"] == 0


@pytest.mark.heavy  # a process importing Keras and keras_hub (~30 s on 2 cores)
def test_keras_hubs_gpt2_reads_the_same_folder(tmp_path, model, folders):
    from helpers import FAST_TIMING, run_cli

    out = run_cli("model=gpt2_keras_hub", "backend=torch", "task=generate", f"task.new_tokens={NEW_TOKENS}",
                  "batch_size=2", f"model.weights={folders['safetensors']}", "tracking=none",
                  f"hydra.run.dir={tmp_path}/run", *FAST_TIMING, timeout=600)  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    with h5py.File(tmp_path / "run" / "tensors.h5") as f:
        prompt, tokens = f["inputs/x"][()], f["outputs/tokens"][()]
    np.testing.assert_array_equal(tokens, transformers_generation(model, prompt, tokens, "float32")[0])

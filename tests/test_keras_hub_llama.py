"""model=keras_hub_llama: keras_hub's Llama holding model=llama's weights. The weight mapping (LlamaForCausalLM's layout
onto keras_hub's variables) and the refusals, without a framework; in the heavy set, keras_hub's logits against the
runner's float64 NumPy Llama in this process, and generation through keras_hub's own generate() on TensorFlow, JAX and
torch (each Keras backend in a process of its own), its tokens against model=llama's."""

from __future__ import annotations

import sys
from pathlib import Path

import h5py
import numpy as np
import pytest
from helpers import compose_config, decided_tokens, generate_cli

from runner.backends import load_backend
from runner.config import ConfigError, check_combination
from runner.models import build_workload
from runner.models.keras_hub_llama import KerasHubLlama
from runner.models.llama import Llama

SIZES = {"layers": 2, "d_model": 32, "heads": 4, "kv_heads": 2, "ffn": 48, "vocab_size": 64, "context": 32,
         "prompt_len": 5}  # fmt: skip
# a tied head, one key/value head for all four query heads, and Llama 3's rope scaling in all of its regimes at these
# sizes' wavelengths (6.3 between 4 and 16: interpolated; 63, 628, 6283 above 16: divided by the factor)
SCALED = {"tie_embeddings": True, "kv_heads": 1, "rope_theta": 10000.0,
          "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                           "original_max_position_embeddings": 16}}  # fmt: skip
SCALED_OVERRIDES = ["model.tie_embeddings=true", "model.kv_heads=1", "model.rope_theta=10000.0",
                    "model.rope_scaling={factor:8.0,low_freq_factor:1.0,high_freq_factor:4.0,"
                    "original_max_position_embeddings:16}"]  # fmt: skip


def _model(backend: str = "tensorflow", **changed) -> KerasHubLlama:
    return KerasHubLlama(f"runner.backends.{backend}_backend", **{**SIZES, **changed})


def test_llama_layout_maps_onto_keras_hub_variables_head_by_head():
    """q_proj's (heads x head size, d) rows are the heads one after another: query kernel [:, h, k] is row h * head size
    + k; key and value have kv_heads heads; o_proj's columns are the merged heads in the same order; the MLP's
    matrices are transposed; an untied lm_head is the embedding's reverse, a tied one sets nothing more."""
    model = _model()
    params = model.init_params(np.random.default_rng(0))
    weights = model.keras_weights(params)
    d, size = model.d_model, model.head_size
    q, k, o = (params[f"layers.1.self_attn.{name}.weight"] for name in ("q_proj", "k_proj", "o_proj"))
    query, key = (weights[f"transformer_layer_1/self_attention/{part}/kernel"] for part in ("query", "key"))
    assert query.shape == (d, 4, size) and key.shape == (d, 2, size)
    for head in range(4):
        np.testing.assert_array_equal(query[:, head, 3], q[head * size + 3])
    np.testing.assert_array_equal(key[:, 1, 2], k[size + 2])
    out = weights["transformer_layer_1/self_attention/attention_output/kernel"]
    np.testing.assert_array_equal(out[1, 2], o[:, size + 2])
    gate = weights["transformer_layer_0/feedforward_gate_dense/kernel"]
    np.testing.assert_array_equal(gate, params["layers.0.mlp.gate_proj.weight"].T)
    np.testing.assert_array_equal(weights["token_embedding/reverse_embeddings"], params["lm_head.weight"].T)
    assert len(weights) == len(params)  # one Keras variable per parameter
    tied = _model(tie_embeddings=True)
    assert "token_embedding/reverse_embeddings" not in tied.keras_weights(tied.init_params(np.random.default_rng(0)))


def test_the_weights_are_model_llamas_for_the_same_seed():
    """The same spec and initialisation: model=llama's seeded weights, so a seed gives both the same model."""
    ours, theirs = (m.init_params(np.random.default_rng(3)) for m in (_model(), Llama(**SIZES)))
    assert ours.keys() == theirs.keys()
    assert all(np.array_equal(ours[name], theirs[name]) for name in ours)


@pytest.mark.parametrize(
    ("overrides", "refusal"),
    [
        (["backend=tensorflow", "dtype=float64"], "runs only dtype=float32, not dtype=float64"),
        (["backend=torch", "mode=function"], "runs only mode=eager on backend=torch, not mode=function"),
        (["backend=jax", "mode=xla"], "runs only mode=eager, not mode=xla"),
        (["backend=torch", "precision=bf16_mixed"], "not precision=bf16_mixed"),
        (["backend=numpy"], "needs keras ops: it runs on backend=jax or backend=tensorflow or backend=torch, not "
                            "backend=numpy; model=llama runs the same model on every backend"),
    ],
)  # fmt: skip
def test_what_keras_hubs_llama_cannot_do_is_refused_in_one_line(overrides, refusal):
    with pytest.raises(ConfigError, match=refusal):
        check_combination(compose_config("model=keras_hub_llama", "task=generate", *overrides))


def test_qwen2s_biases_are_refused_naming_what_is_allowed():
    cfg = compose_config("model=keras_hub_llama", "task=generate", "backend=jax", "model.qkv_bias=true")
    check_combination(cfg)  # a setting of model=llama's: refused by the class, before any framework is imported
    said = r"^model.qkv_bias=true .*: keras_hub's Llama has no attention biases; allowed: model.qkv_bias=false \("
    with pytest.raises(ConfigError, match=said):
        build_workload(cfg.model)


def test_the_presets_are_model_llamas_at_the_same_sizes():
    """model=keras_hub_llama_smollm2_135m is model=llama_smollm2_135m's every setting; +implementation=keras_hub_llama
    turns any Llama preset into keras_hub's (Llama-3.2-1B's rope scaling and tied head included)."""

    def settings(*overrides: str) -> dict:
        model = compose_config(*overrides, "task=generate", "backend=jax").model
        return {k: v for k, v in model.items() if k not in ("_target_", "name", "supports", "backend_module", "dtype")}

    assert settings("model=keras_hub_llama_smollm2_135m") == settings("model=llama_smollm2_135m")
    assert settings("model=keras_hub_llama") == settings("model=llama")
    one_b = compose_config("model=llama_32_1b", "+implementation=keras_hub_llama", "task=generate", "backend=torch")
    check_combination(one_b)
    model = build_workload(one_b.model)
    assert isinstance(model, KerasHubLlama) and model.tie_embeddings and model.rope_scaling["factor"] == 32.0


# -- keras_hub's arithmetic: in this process (heavy: Keras and a framework imported), then generation per backend -----


@pytest.mark.heavy  # imports Keras, keras_hub and a framework (~10 s on 2 cores)
@pytest.mark.parametrize("changed", [{}, SCALED], ids=["untied", "tied-scaled"])
def test_keras_hub_logits_are_the_numpy_llamas_on_the_same_weights(changed):
    """keras_hub's Llama3CausalLM holding the runner's weights gives model=llama's float64 NumPy logits within
    float32's error: an untied head and grouped-query attention; a tied head, one key/value head and Llama 3's rope
    scaling (which changes the logits). Runs on the Keras backend this process already has, else TensorFlow."""
    backend = sys.modules["keras"].backend.backend() if "keras" in sys.modules else "tensorflow"
    ops = load_backend(f"runner.backends.{backend}_backend")
    rng = np.random.default_rng(0)
    llama = Llama(**{**SIZES, **changed})
    params = llama.init_params(rng)
    x = rng.integers(0, SIZES["vocab_size"], (3, 9))
    reference = llama.reference_logits(params, x)
    model = _model(backend, **changed)
    y = ops.to_numpy(model.forward(ops, {k: ops.asarray(v, "cpu", "float32") for k, v in params.items()},
                                   ops.token_ids(x, "cpu")))  # fmt: skip
    assert y.shape == (3, 9, SIZES["vocab_size"]) and str(y.dtype) == "float32"
    assert np.abs(y - reference).max() <= 1e-5 * np.abs(reference).max()  # measured 2e-7 to 3e-7
    if changed:
        unscaled = Llama(**{**SIZES, **changed, "rope_scaling": None}).reference_logits(params, x)
        assert np.abs(unscaled - reference).max() > 1e-3 * np.abs(reference).max()


def _generate(tmp_path: Path, backend: str, model: str, *extra: str) -> tuple[dict, np.ndarray]:
    sizes = [f"model.{key}={value}" for key, value in SIZES.items()]
    run_dir = tmp_path / f"{backend}-{model}"
    return generate_cli(
        run_dir, f"backend={backend}", f"model={model}", "task.new_tokens=6", "batch_size=3", *sizes, *extra
    )


CASES = {"untied": ({}, []), "tied-scaled": (SCALED, SCALED_OVERRIDES)}


@pytest.fixture(scope="module")
def weights(tmp_path_factory) -> dict[str, Path]:
    """model=llama's seeded weights with the attention's and the MLP's matrices 20 times larger, per case: a seeded
    Llama repeats its prompt's last token (the token embedding dominates the residual stream); with layers that
    count, each step picks another token, so a cache written at the wrong position or a rotary angle at the wrong
    index shows in the tokens."""
    paths = {}
    for case, (changed, _) in CASES.items():
        params = Llama(**{**SIZES, **changed}).init_params(np.random.default_rng(1))
        paths[case] = tmp_path_factory.mktemp("weights") / f"{case}.h5"
        with h5py.File(paths[case], "w") as f:
            for name, array in params.items():
                f[name] = array * (20 if ".self_attn." in name or ".mlp." in name else 1)
    return paths


@pytest.fixture(scope="module")
def llama_runs(tmp_path_factory, weights) -> dict[str, tuple[np.ndarray, int]]:
    """model=llama on NumPy with the same weights, sizes, seed and batch, per case: the runner's own tokens, and how
    many it decided."""
    runs = {}
    for case, (_, overrides) in CASES.items():
        folder = tmp_path_factory.mktemp("numpy")
        saved, tokens = _generate(folder, "numpy", "llama", f"model.weights={weights[case]}", *overrides)
        assert saved["metrics"]["tokens_differ"] == 0.0
        assert len(np.unique(tokens)) > 3  # tokens that vary
        runs[case] = tokens, decided_tokens(saved, tokens)
    return runs


@pytest.mark.heavy  # a process importing Keras and keras_hub on each framework (~30 s each on 2 cores)
@pytest.mark.parametrize(
    ("backend", "case"), [("tensorflow", "untied"), ("jax", "untied"), ("torch", "untied"), ("jax", "tied-scaled")]
)
def test_keras_hub_generates_model_llamas_tokens(tmp_path, backend, case, weights, llama_runs):
    """keras_hub's generate() (greedy, never stopping early) makes the tokens model=llama makes from the same weights
    and prompt, wherever both references decide them; its logits without a cache are float32's error from float64;
    the record says what keras_hub compiled."""
    llama_tokens, llama_decided = llama_runs[case]
    saved, tokens = _generate(tmp_path, backend, "keras_hub_llama", f"model.weights={weights[case]}", *CASES[case][1])
    metrics = saved["metrics"]
    assert saved["status"] == "FINISHED"
    assert tokens.shape == llama_tokens.shape == (3, 6)
    assert metrics["tokens_differ"] == 0.0 and metrics["tokens_decided"] > 0
    assert metrics["max_rel_err_vs_reference"] <= 1e-5 and metrics["within_reference_tolerance"] == 1.0
    both = min(decided_tokens(saved, tokens), llama_decided)
    assert both > 0
    np.testing.assert_array_equal(tokens[:, :both], llama_tokens[:, :both])
    compiled = saved["environment"]["keras_hub_generate"]
    assert compiled.startswith({"jax": "jax.jit", "tensorflow": "tf.function", "torch": "nothing compiled"}[backend])
    assert saved["environment"]["keras_hub_forward"].startswith("Llama3CausalLM")

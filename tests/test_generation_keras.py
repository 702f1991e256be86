"""model=gpt2_keras_hub: keras_hub's GPT-2 holding model=gpt2's weights. The weight mapping (GPT-2's layout onto
keras_hub's variables) against the runner's float64 NumPy GPT-2, in this process; generation through keras_hub's own
generate() on TensorFlow, JAX and torch (each Keras backend in a process of its own), its tokens against the runner's
NumPy GPT-2's; and the combinations the yaml refuses."""

from __future__ import annotations

import sys
from pathlib import Path

import h5py
import numpy as np
import pytest
from helpers import compose_config, decided_tokens, generate_cli

from runner.backends import load_backend, numpy_backend
from runner.config import ConfigError, check_combination
from runner.models.decoder import Decoder
from runner.models.keras_hub_gpt2 import KerasHubGPT2

SIZES = {"layers": 2, "d_model": 16, "heads": 2, "vocab_size": 64, "context": 32, "prompt_len": 5}
OVERRIDES = [f"model.{key}={value}" for key, value in SIZES.items()] + ["task.new_tokens=6", "batch_size=3"]


def _model(backend: str, dtype: str = "float32") -> KerasHubGPT2:
    return KerasHubGPT2(f"runner.backends.{backend}_backend", dtype=dtype, **SIZES)


def test_gpt2_layout_maps_onto_keras_hub_variables_head_by_head():
    """c_attn's (d, 3 d) columns are queries | keys | values, each head's features together: query kernel [:, h, k]
    is column h * head_size + k; c_proj's input rows are the merged heads in the same order. No framework needed."""
    model = _model("tensorflow")
    params = model.init_params(np.random.default_rng(0))
    weights = model.keras_weights(params)
    d, size = model.d_model, model.d_model // model.heads
    qkv, proj = params["h.1.attn.c_attn.weight"], params["h.1.attn.c_proj.weight"]
    for j, part in enumerate(("query", "key", "value")):
        kernel = weights[f"transformer_layer_1/self_attention/{part}/kernel"]
        assert kernel.shape == (d, model.heads, size)
        for head in range(model.heads):
            np.testing.assert_array_equal(kernel[:, head, 3], qkv[:, j * d + head * size + 3])
    out = weights["transformer_layer_1/self_attention/attention_output/kernel"]
    np.testing.assert_array_equal(out[1, 2], proj[size + 2])
    assert len(weights) == len(params) + 4 * model.layers  # c_attn's weight and bias each became three


def test_keras_hub_logits_are_the_numpy_decoders_on_the_same_weights():
    """keras_hub's GPT2CausalLM holding the runner's weights gives model=gpt2's float64 NumPy logits (float32's
    error); in float64 on TensorFlow, float64's (TensorFlow's tanh GELU rounds its 0.044715 to float32: 1e-11). Runs
    on the Keras backend this process already has, else TensorFlow."""
    backend = sys.modules["keras"].backend.backend() if "keras" in sys.modules else "tensorflow"
    ops = load_backend(f"runner.backends.{backend}_backend")
    rng = np.random.default_rng(0)
    params = Decoder(**SIZES).init_params(rng)
    x = rng.integers(0, SIZES["vocab_size"], (3, 9))
    reference = Decoder(**SIZES).forward(numpy_backend, params, x)
    dtypes = ("float32", "float64") if backend == "tensorflow" else ("float32",)
    for dtype in dtypes:
        bound = {"float32": 1e-5, "float64": 1e-9}[dtype]
        model = _model(backend, dtype)
        placed = {k: ops.asarray(v, "cpu", dtype) for k, v in params.items()}
        y = ops.to_numpy(model.forward(ops, placed, ops.token_ids(x, "cpu")))
        assert y.shape == (3, 9, SIZES["vocab_size"]) and str(y.dtype) == dtype
        assert np.abs(y - reference).max() <= bound * np.abs(reference).max(), dtype
        # the reference every implementation is checked against: model=gpt2's float64 NumPy forward
        np.testing.assert_array_equal(model.reference_logits(params, x), reference)


@pytest.mark.parametrize(
    ("overrides", "refusal"),
    [
        (["backend=torch", "dtype=float64"], "runs only dtype=float32 on backend=torch, not dtype=float64"),
        (["backend=jax", "dtype=float64"], "runs only dtype=float32 on backend=jax, not dtype=float64"),
        (["backend=tensorflow", "mode=function"], "runs only mode=eager, not mode=function"),
        (["backend=torch", "precision=bf16_mixed"], "not precision=bf16_mixed"),
        (["backend=numpy"], "needs keras ops: it runs on backend=jax or backend=tensorflow or backend=torch"),
        (["backend=tensorflow", "task=gradients"], "not task=gradients"),
    ],
)
def test_what_keras_hubs_gpt2_cannot_do_is_refused_in_one_line(overrides, refusal):
    with pytest.raises(ConfigError, match=refusal):
        check_combination(compose_config("model=gpt2_keras_hub", "task=generate", *overrides))


def test_float64_on_tensorflow_and_the_small_preset_pass_the_rules():
    check_combination(compose_config("model=gpt2_keras_hub", "task=generate", "backend=tensorflow", "dtype=float64"))
    small = compose_config("model=gpt2_small_keras_hub", "task=inference", "backend=jax")
    check_combination(small)
    assert (small.model.layers, small.model.d_model, small.model.vocab_size, small.model.prompt_len) == (
        12, 768, 50257, 32
    )  # fmt: skip


# -- generation through keras_hub's generate(), a process per Keras backend ----------------------------------


@pytest.fixture(scope="module")
def weights(tmp_path_factory) -> Path:
    """model=gpt2's seeded weights with the position embedding 10 times larger: a seeded GPT-2 repeats its prompt's last
    token (its head is the token embedding); with positions that count, each step picks another token, so a cache
    written at the wrong position or a position embedding read at the wrong index shows in the tokens."""
    params = Decoder(**SIZES).init_params(np.random.default_rng(1))
    params["wpe.weight"] *= 10
    path = tmp_path_factory.mktemp("weights") / "gpt2.h5"
    with h5py.File(path, "w") as f:
        for name, array in params.items():
            f[name] = array
    return path


def _generate(tmp_path: Path, backend: str, model: str, weights: Path, *extra: str) -> tuple[dict, np.ndarray]:
    run_dir = tmp_path / f"{backend}-{model}"
    return generate_cli(run_dir, f"backend={backend}", f"model={model}", f"model.weights={weights}", *OVERRIDES, *extra)


@pytest.fixture(scope="module")
def numpy_run(tmp_path_factory, weights) -> tuple[np.ndarray, int]:
    """model=gpt2 on NumPy with the same weights, sizes, seed and batch: the runner's own tokens, and how many it
    decided."""
    saved, tokens = _generate(tmp_path_factory.mktemp("numpy"), "numpy", "gpt2", weights)
    assert saved["metrics"]["tokens_differ"] == 0.0
    assert len(np.unique(tokens)) > 3  # tokens that vary
    return tokens, decided_tokens(saved, tokens)


@pytest.mark.heavy  # a process importing Keras and keras_hub on each framework (~30 s each on 2 cores)
@pytest.mark.parametrize("backend", ["tensorflow", "jax", "torch"])
def test_keras_hub_generates_model_gpt2s_tokens(tmp_path, backend, weights, numpy_run):
    """keras_hub's generate() (greedy, never stopping early) makes the tokens the runner's NumPy GPT-2 makes from the
    same weights and prompt, wherever both references decide them; its logits without a cache are float32's error
    from float64; the record says what keras_hub compiled."""
    numpy_tokens, numpy_decided = numpy_run
    saved, tokens = _generate(tmp_path, backend, "gpt2_keras_hub", weights)
    metrics = saved["metrics"]
    assert saved["status"] == "FINISHED"
    assert tokens.shape == numpy_tokens.shape == (3, 6)
    assert metrics["tokens_differ"] == 0.0 and metrics["tokens_decided"] > 0
    assert metrics["max_rel_err_vs_reference"] <= 1e-5
    both = min(decided_tokens(saved, tokens), numpy_decided)
    np.testing.assert_array_equal(tokens[:, :both], numpy_tokens[:, :both])
    compiled = saved["environment"]["keras_hub_generate"]
    assert compiled.startswith({"jax": "jax.jit", "tensorflow": "tf.function", "torch": "nothing compiled"}[backend])


@pytest.mark.heavy  # Keras and keras_hub on TensorFlow in a process of its own
def test_keras_hub_in_float64_on_tensorflow_is_float64s_error_from_numpy(tmp_path, weights, numpy_run):
    numpy_tokens, numpy_decided = numpy_run
    saved, tokens = _generate(tmp_path, "tensorflow", "gpt2_keras_hub", weights, "dtype=float64")
    metrics = saved["metrics"]
    assert metrics["max_rel_err_vs_reference"] <= 1e-9  # measured 1.1e-11: TensorFlow's GELU constant
    assert metrics["tokens_differ"] == 0.0 and metrics["within_reference_tolerance"] == 1.0
    both = min(decided_tokens(saved, tokens), numpy_decided)
    np.testing.assert_array_equal(tokens[:, :both], numpy_tokens[:, :both])

"""model=llama: the cached steps against the whole sequence recomputed, every backend's tokens and logits against
float64 NumPy, grouped-query attention, tied and untied heads, the rotary embedding and Llama 3's rope scaling, the
presets' sizes, the refusals, and (where transformers is installed) Hugging Face's LlamaForCausalLM on the same
weights."""

from __future__ import annotations

import math
from pathlib import Path

import h5py
import numpy as np
import pytest

from runner.backends import numpy_backend
from runner.config import ConfigError, compose
from runner.measure.job import run_and_record
from runner.models import build_workload
from runner.models.llama import Llama, inverse_frequencies
from runner.record.naming import job_spec
from runner.tasks import Setup
from runner.tasks.generate import Generation

SIZES = ["model.layers=2", "model.d_model=32", "model.heads=4", "model.kv_heads=2", "model.ffn=48"]
SIZES += ["model.vocab_size=64", "model.prompt_len=5"]
FAST = ["timing.warmup_s=0", "timing.min_warmup_calls=1", "timing.min_repeats=2", "timing.max_time_s=0.05"]
FAST += ["timing.rounds=1"]
LLAMA3_SCALING = {
    "factor": 32.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
}


def rope_scaling(**changed: float) -> str:
    """model.rope_scaling={...} on the command line: Llama 3's settings, some changed."""
    return "model.rope_scaling={" + ",".join(f"{k}:{v}" for k, v in {**LLAMA3_SCALING, **changed}.items()) + "}"


def run(tmp_path: Path, *overrides: str):
    cfg = compose([*FAST, "model=llama", "task=generate", "task.new_tokens=6", *SIZES, "batch_size=3", "tracking=none",
                   *overrides])  # fmt: skip
    outcome = run_and_record(job_spec(cfg), tmp_path)
    assert outcome.status == "FINISHED", outcome.error
    return outcome


def small(**sizes) -> Llama:
    return Llama(**{"layers": 2, "d_model": 32, "heads": 4, "kv_heads": 2, "ffn": 48, "vocab_size": 64, "context": 32,
                    "prompt_len": 5, **sizes})  # fmt: skip


def numpy_setup(model: Llama, seed: int = 0) -> Setup:
    rng = np.random.default_rng(seed)
    params = model.init_params(rng)
    return Setup(numpy_backend, model, "eager", "cpu", params, model.make_inputs(rng, 2), {}, False, "full", "float64")


@pytest.mark.parametrize("sizes", [{}, {"kv_heads": 4}, {"kv_heads": 1, "tie_embeddings": True, "qkv_bias": True}])
def test_decoding_with_the_cache_is_recomputing_the_whole_sequence(sizes):
    model = small(**sizes)
    setup = numpy_setup(model)
    generation = Generation(setup, new_tokens=7)
    tokens = generation()
    sequence = np.concatenate([setup.inputs["x"], tokens[:, :-1]], axis=1)
    whole = model.reference_logits(setup.params, sequence)[:, model.prompt_len - 1 :]
    np.testing.assert_allclose(np.stack(generation.first_logits, axis=1), whole, rtol=0, atol=1e-12)
    np.testing.assert_array_equal(tokens, whole.argmax(-1))
    assert generation.cache_shape == (2, model.kv_heads, 5 + 7, 8)  # the cache holds the key/value heads only


def _case(backend: str, mode: str, *extra: str, heavy: bool = False):
    name = "-".join([backend, mode, *(e.split("=")[0].removeprefix("model.") for e in extra)])
    return pytest.param(backend, mode, list(extra), marks=[pytest.mark.heavy] * heavy, id=name)


# Each backend eager and compiled at float32, grouped-query attention (4 query heads, 2 key/value heads) and an untied
# head; a few cases vary the model: kv_heads = heads (no repeat), one key/value head with the head tied and Qwen2's
# biases, Llama 3's rope scaling. torch.compile (~20 s on 2 cores) and XLA run in the heavy set.
CASES = [
    _case("numpy", "eager"),
    _case("torch", "eager"),
    _case("torch", "eager", "model.kv_heads=4", "model.tie_embeddings=true"),
    _case("jax", "eager"),
    _case("jax", "function"),
    _case("jax", "function", "model.kv_heads=1", "model.tie_embeddings=true", "model.qkv_bias=true"),
    _case("tensorflow", "eager"),
    _case("tensorflow", "function"),
    _case("tensorflow", "function", "model.rope_theta=100", rope_scaling(original_max_position_embeddings=64)),
    _case("tnp", "eager"),
    _case("tnp", "function"),
    _case("torch", "function", heavy=True),
    _case("jax", "xla", heavy=True),
    _case("tensorflow", "xla", heavy=True),
]


@pytest.mark.parametrize(("backend", "mode", "extra"), CASES)
def test_every_backend_generates_the_reference_tokens(tmp_path, backend, mode, extra):
    outcome = run(tmp_path, f"backend={backend}", f"mode={mode}", "dtype=float32", *extra)
    m = outcome.metrics
    assert m["within_reference_tolerance"] == 1.0, m["max_rel_err_vs_reference"]
    assert m["tokens_differ"] == 0 and m["tokens_decided"] > 0
    assert m["cache_vs_recompute_max_rel_err"] <= 1e-5
    kv_heads = int(next((e.split("=")[1] for e in extra if e.startswith("model.kv_heads=")), 2))
    assert m["kv_cache_mb"] * 1e6 == 2 * 2 * 3 * kv_heads * (5 + 6) * 8 * 4  # layers x 2 x batch x kv x length x size
    with h5py.File(tmp_path / "tensors.h5") as f:
        assert f["outputs/tokens"].shape == (3, 6) and f["outputs/logits"].shape == (3, 6, 64)
        assert ("weights/lm_head.weight" in f) == ("model.tie_embeddings=true" not in extra)
    if backend in ("tensorflow", "tnp", "jax") and mode != "eager":
        assert outcome.environment["decode_compilations"] == "1"  # one trace for every token: no retracing
        assert outcome.environment["prefill_compilations"] == "1"


@pytest.mark.heavy
@pytest.mark.parametrize("backend", ["torch", "jax", "tensorflow", "tnp"])
def test_bfloat16_generation_is_within_its_tolerance(tmp_path, backend):
    """RMSNorm and the rotary embedding in the run's dtype (the angles in float32, as HF computes them)."""
    outcome = run(tmp_path, f"backend={backend}", "mode=eager", "dtype=bfloat16")
    assert outcome.metrics["within_reference_tolerance"] == 1.0 and outcome.metrics["tokens_differ"] == 0


def test_task_inference_gives_the_logits_of_the_prompt(tmp_path):
    cfg = compose([*FAST, "model=llama", "task=inference", *SIZES, "backend=numpy", "dtype=float32", "tracking=none"])
    outcome = run_and_record(job_spec(cfg), tmp_path)
    assert outcome.status == "FINISHED", outcome.error
    assert outcome.metrics["within_reference_tolerance"] == 1.0


def _ids(model: Llama, seed: int = 1) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, model.vocab_size, (2, 9))


def test_grouped_query_attention_is_each_key_value_head_shared_by_its_group_of_query_heads():
    """2 key/value heads for 4 query heads compute what 4 key/value heads compute whose heads 0, 1 are the first's
    and 2, 3 the second's (HF's repeat_kv: query head j reads key/value head j // (heads / kv_heads))."""
    grouped, full = small(kv_heads=2), small(kv_heads=4)
    params = grouped.init_params(np.random.default_rng(0))
    repeated = dict(params)
    for name in (n for n in params if n.endswith(("k_proj.weight", "v_proj.weight"))):
        heads = params[name].reshape(2, 8, 32)  # (kv_heads, head size, d_model)
        repeated[name] = np.repeat(heads, 2, axis=0).reshape(32, 32)
    ids = _ids(grouped)
    np.testing.assert_allclose(grouped.reference_logits(params, ids), full.reference_logits(repeated, ids), atol=1e-14)
    swapped = dict(repeated)
    for name in (n for n in params if n.endswith("k_proj.weight")):
        swapped[name] = np.repeat(params[name].reshape(2, 8, 32), 2, axis=0)[[0, 2, 1, 3]].reshape(32, 32)
    assert not np.allclose(grouped.reference_logits(params, ids), full.reference_logits(swapped, ids), atol=1e-6)


def test_a_tied_head_is_the_token_embedding():
    tied, untied = small(tie_embeddings=True), small()
    params = tied.init_params(np.random.default_rng(0))
    assert "lm_head.weight" not in params and "lm_head.weight" in untied.spec
    with_head = {**params, "lm_head.weight": params["embed_tokens.weight"]}
    ids = _ids(tied)
    np.testing.assert_array_equal(tied.reference_logits(params, ids), untied.reference_logits(with_head, ids))
    other = {**with_head, "lm_head.weight": np.random.default_rng(3).standard_normal((64, 32))}
    assert not np.allclose(tied.reference_logits(params, ids), untied.reference_logits(other, ids))


def test_rotary_rotates_each_pair_of_a_heads_halves_by_position_times_frequency():
    """HF's rotate_half: features i and i + size / 2 of a head form a pair, turned by position x inv_freq[i]."""
    inv_freq = (1.0, 0.1, 0.01, 0.001)
    x = np.random.default_rng(0).standard_normal((1, 1, 3, 8))  # (batch, heads, seq, size)
    turned = numpy_backend.rotary(x, numpy_backend.rotary_angles(inv_freq, 5, x[:, 0]))
    for position in range(3):
        for i, frequency in enumerate(inv_freq):
            angle = (5 + position) * frequency
            a, b = x[0, 0, position, i], x[0, 0, position, i + 4]
            expected = (a * math.cos(angle) - b * math.sin(angle), b * math.cos(angle) + a * math.sin(angle))
            np.testing.assert_allclose(turned[0, 0, position, [i, i + 4]], expected, rtol=1e-14)


def test_llama3_rope_scaling_changes_the_inverse_frequencies_as_llama_3_does():
    """Llama-3.2-1B's settings against the formula written out one frequency at a time: wavelengths under
    8192 / 4 kept, over 8192 / 1 divided by 32, and those between interpolated."""
    plain, scaled = inverse_frequencies(64, 500000.0, None), inverse_frequencies(64, 500000.0, LLAMA3_SCALING)
    assert plain[1] == pytest.approx(500000.0 ** (-2 / 64), rel=1e-15)
    regimes = set()
    for frequency, got in zip(plain, scaled, strict=True):
        wavelength = 2 * math.pi / frequency
        if wavelength < 8192 / 4:
            expected, regime = frequency, "kept"
        elif wavelength > 8192 / 1:
            expected, regime = frequency / 32, "divided"
        else:
            smooth = (8192 / wavelength - 1) / (4 - 1)
            expected, regime = (1 - smooth) * frequency / 32 + smooth * frequency, "interpolated"
        regimes.add(regime)
        assert got == pytest.approx(expected, rel=1e-14), regime
    assert regimes == {"kept", "divided", "interpolated"}
    assert Llama(rope_scaling=LLAMA3_SCALING).inv_freq != Llama().inv_freq


def test_the_presets_have_their_models_sizes():
    """Parameters as published: SmolLM2-135M 134.5 M, Llama-3.2-1B 1.236 B, Qwen2.5-0.5B 494 M (its q, k, v biases),
    Qwen3-0.6B 596 M (its q/k norms, heads of 128), Mistral-7B 7.24 B (its untied head)."""
    counts = {"llama_smollm2_135m": 134_515_008, "llama_32_1b": 1_235_814_400, "llama_qwen25_05b": 494_032_768,
              "llama_qwen3_06b": 596_049_920, "llama_mistral_7b": 7_241_732_096}  # fmt: skip
    for preset, count in counts.items():
        model = build_workload(compose([f"model={preset}", "task=generate"]).model)
        assert sum(int(np.prod(shape)) for shape in model.spec.values()) == count, preset
        assert ("lm_head.weight" in model.spec) == (preset == "llama_mistral_7b")  # the others tie the head


@pytest.mark.parametrize(
    ("setting", "said"),
    [
        ("model.d_model=30", "model.d_model=30 is not divisible by model.heads=4"),
        ("model.kv_heads=3", "model.heads=4 is not divisible by model.kv_heads=3"),
        ("model.kv_heads=0", "model.kv_heads=0: must be a positive integer"),
        ("model.d_model=20", "the head size (model.head_dim, or model.d_model / model.heads) is 5, odd: rotary"),
        ("model.prompt_len=200", "model.prompt_len=200 is longer than the model's context (128 tokens)"),
        ("model.rms_eps=0", "model.rope_theta=500000.0 and model.rms_eps=0 must be positive"),
        ("model.rope_scaling={factor:8}", "model.rope_scaling has factor; llama3 takes factor, low_freq_factor"),
        ("model.rope_scaling={rope_type:yarn}", "model.rope_scaling has none; yarn takes factor, original_max_pos"),
        ("model.rope_scaling={rope_type:longrope}", "model.rope_scaling.rope_type=longrope: the kinds computed are"),
        (rope_scaling(high_freq_factor=1.0), "model.rope_scaling.high_freq_factor=1.0 must be above low_freq_factor"),
        ("model.rope_scaling=8", "model.rope_scaling=8 must be null or a mapping with a rope_type and its"),
    ],
)  # fmt: skip
def test_sizes_a_llama_cannot_take_are_one_line(tmp_path, setting, said):
    cfg = compose([*FAST, "model=llama", "task=generate", "backend=numpy", "tracking=none", setting])
    outcome = run_and_record(job_spec(cfg), tmp_path)
    assert outcome.status == "FAILED" and "\n" not in outcome.error
    assert outcome.error.startswith(said), outcome.error


def test_a_generation_longer_than_the_context_is_one_line():
    with pytest.raises(ConfigError, match="^model.prompt_len \\+ task.new_tokens: 40 tokens do not fit .* of 32 posi"):
        small().check_length(40, "model.prompt_len + task.new_tokens")


def test_a_cache_beyond_the_machine_is_refused_before_it_starts(tmp_path):
    cfg = compose([*FAST, "model=llama_32_1b", "task=generate", "task.new_tokens=900", "batch_size=100000",
                   "backend=numpy", "tracking=none"])  # fmt: skip
    outcome = run_and_record(job_spec(cfg), tmp_path)
    assert outcome.status == "FAILED"
    assert "of host memory" in outcome.error and "activations" in outcome.error


# -- Hugging Face's LlamaForCausalLM (and Qwen2ForCausalLM) on the same weights -----------------------------------

HF_SCALING = {**LLAMA3_SCALING, "original_max_position_embeddings": 64}  # with rope_theta 100: all three regimes


def _hf_model(model: Llama, family: str, transformers, torch):
    """transformers' causal LM of the model's sizes in float64 (Qwen2's: q, k, v biases), no token ending a
    generation, its norms' weights moved off 1 so that they matter."""
    config_class, model_class = {
        "llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM),
        "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM),
    }[family]
    config = config_class(
        vocab_size=model.vocab_size, hidden_size=model.d_model, intermediate_size=model.ffn,
        num_hidden_layers=model.layers, num_attention_heads=model.heads, num_key_value_heads=model.kv_heads,
        max_position_embeddings=model.context, rms_norm_eps=model.rms_eps, rope_theta=100.0,
        rope_scaling={"rope_type": "llama3", **HF_SCALING}, tie_word_embeddings=model.tie_embeddings,
        bos_token_id=None, eos_token_id=None, pad_token_id=0,
    )  # fmt: skip
    torch.manual_seed(0)
    hf = model_class(config).double().eval()
    with torch.no_grad():
        for name, parameter in hf.named_parameters():
            if name.endswith("norm.weight") or name.endswith(".bias"):
                parameter.add_(0.1 * torch.randn_like(parameter))
    return hf


def _in_float64(hf, model: Llama, torch, monkeypatch) -> None:
    """HF's RMSNorm and rotary angles computed in float64 (as shipped, both compute in float32 even in a float64
    model), the angles from the runner's inverse frequencies (HF's are float32: checked apart)."""

    def rms_norm(self, x):
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.variance_epsilon))

    def rotary(x, position_ids):
        angles = position_ids[..., None].double() * torch.tensor(model.inv_freq, dtype=torch.float64)
        angles = torch.cat((angles, angles), dim=-1)
        return angles.cos().to(x.dtype), angles.sin().to(x.dtype)

    for module in hf.modules():
        if type(module).__name__.endswith("RMSNorm"):
            monkeypatch.setattr(module, "forward", rms_norm.__get__(module))
    monkeypatch.setattr(hf.model.rotary_emb, "forward", rotary)


@pytest.mark.parametrize(("family", "tied"), [("llama", False), ("llama", True), ("qwen2", True)])
def test_the_reference_is_hugging_faces_model_on_the_same_weights(family, tied, monkeypatch):
    """The float64 NumPy reference against transformers' LlamaForCausalLM (GQA, Llama 3's rope scaling in all three
    of its regimes; Qwen2's: model.qkv_bias) on the same weights, its state dict without `model.`: logits within 1e-9
    with HF's RMSNorm and rotary angles in float64, within float32's error as it ships; the inverse frequencies within
    float32's rounding of HF's; greedy tokens equal to its generate(do_sample=False)."""
    transformers = pytest.importorskip("transformers")
    import torch

    model = small(rope_theta=100.0, rope_scaling=HF_SCALING, tie_embeddings=tied, qkv_bias=family == "qwen2",
                  context=128)  # fmt: skip
    hf = _hf_model(model, family, transformers, torch)
    state = {k.removeprefix("model."): v.detach().numpy() for k, v in hf.state_dict().items()}
    params = {name: state[name] for name in model.spec}
    np.testing.assert_allclose(hf.model.rotary_emb.inv_freq.numpy(), model.inv_freq, rtol=1e-6)
    ids = _ids(model)
    reference = model.reference_logits(params, ids)
    scale = np.abs(reference).max()
    with torch.no_grad():
        assert np.abs(hf(torch.from_numpy(ids)).logits.numpy() - reference).max() < 1e-5 * scale  # as shipped
        _in_float64(hf, model, torch, monkeypatch)
        np.testing.assert_allclose(hf(torch.from_numpy(ids)).logits.numpy(), reference, rtol=0, atol=1e-9 * scale)
        prompt = torch.from_numpy(ids)
        generated = hf.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=8, do_sample=False)
    setup = Setup(numpy_backend, model, "eager", "cpu", params, {"x": ids}, {}, False, "full", "float64")
    np.testing.assert_array_equal(Generation(setup, new_tokens=8)(), generated[:, ids.shape[1] :].numpy())

"""A Llama-family language model, written once against the op families `attention`, `decoder` (model=llama,
task=generate), computing what Hugging Face's LlamaForCausalLM computes:

    ids (batch, seq) token ids
    x = embed_tokens[ids]                                                 no position embedding: rotary ones instead
    for each layer i:  x = x + o_proj(attention(rotary(q_proj(rms(x))), rotary(k_proj(rms(x))), v_proj(rms(x))))
                       x = x + down_proj(silu(gate_proj(rms(x))) * up_proj(rms(x)))    each rms with its own weight
    logits = norm(x) @ lm_head.T                                          or embed_tokens.T (tie_embeddings)

RMSNorm is x / sqrt(mean(x^2) + rms_eps) * weight, in the run's dtype. Rotary position embeddings follow HF's
"rotate_half" convention (a head's first and second halves are the pairs rotated), with the inverse frequencies
1 / rope_theta^(2i / head size) computed once in float64 NumPy, Llama 3's rope scaling applied to them where
`rope_scaling` is set; each step turns its positions into angles in float32 (float64 in a float64 run), as HF does.
Attention is grouped-query: `heads` query heads share `kv_heads` key/value heads (heads / kv_heads queries each);
the cache holds the kv_heads, repeated to the query heads for attention. No biases, unless `qkv_bias` (Qwen2's
q_proj, k_proj and v_proj biases).

Weights carry the names and layout of HF's LlamaForCausalLM state dict without its `model.` prefix
(`layers.0.self_attn.q_proj.weight`, (out, in) as torch.nn.Linear's), kept as they are on every backend, so
`model.weights=` takes a Llama or Qwen2 checkpoint as users have it, a file or a Hugging Face folder, read strictly
(`read_weights`: runner.models.checkpoints): names under `model.` are found, `lm_head.weight` where the head is untied
(or a copy equal to the embedding where it is tied), every key must be used, and a folder's config.json must describe
this model at the run's sizes (`check_hf_config`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from runner.config import ConfigError, require_positive
from runner.models.causal_lm import CausalLM, check_sizes
from runner.models.checkpoints import Setting, check_config

ROPE_SCALING = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")
# config.json's sizes (LlamaConfig's names) -> (this model's setting, LlamaConfig's default where config.json omits it;
# Qwen2Config's differ in QWEN2_DEFAULTS); num_key_value_heads defaults to num_attention_heads
HF_SIZES = {
    "num_hidden_layers": ("layers", 32),
    "hidden_size": ("d_model", 4096),
    "num_attention_heads": ("heads", 32),
    "intermediate_size": ("ffn", 11008),
    "vocab_size": ("vocab_size", 32000),
    "rms_norm_eps": ("rms_eps", 1e-6),
    "tie_word_embeddings": ("tie_embeddings", False),
}
QWEN2_DEFAULTS = {"intermediate_size": 22016, "vocab_size": 151936}
TRAINED_POSITIONS = {"llama": 2048, "qwen2": 32768}  # max_position_embeddings where config.json leaves it out
# transformers before 4.31 saved each layer's rotary inverse frequencies: a constant the model computes, not a weight
HF_BUFFERS = re.compile(r"(layers\.\d+\.self_attn\.)?rotary_emb\.inv_freq")


def llama_spec(
    layers: int, d_model: int, heads: int, kv_heads: int, ffn: int, vocab_size: int, tied: bool, qkv_bias: bool
) -> dict[str, tuple]:
    """{LlamaForCausalLM's state-dict name without `model.`: shape}; lm_head only when the head is not tied."""
    size = d_model // heads
    spec: dict[str, tuple] = {"embed_tokens.weight": (vocab_size, d_model)}
    for i in range(layers):
        p = f"layers.{i}."
        spec[p + "input_layernorm.weight"] = (d_model,)
        for name, out in (("q_proj", heads * size), ("k_proj", kv_heads * size), ("v_proj", kv_heads * size)):
            spec[p + f"self_attn.{name}.weight"] = (out, d_model)
            if qkv_bias:
                spec[p + f"self_attn.{name}.bias"] = (out,)
        spec[p + "self_attn.o_proj.weight"] = (d_model, heads * size)
        spec[p + "post_attention_layernorm.weight"] = (d_model,)
        spec[p + "mlp.gate_proj.weight"] = spec[p + "mlp.up_proj.weight"] = (ffn, d_model)
        spec[p + "mlp.down_proj.weight"] = (d_model, ffn)
    spec["norm.weight"] = (d_model,)
    if not tied:
        spec["lm_head.weight"] = (vocab_size, d_model)
    return spec


def inverse_frequencies(head_size: int, theta: float, scaling: Mapping[str, float] | None) -> np.ndarray:
    """The rotary embedding's (head_size / 2,) inverse frequencies in float64, Llama 3's scaling applied where set."""
    inv_freq = 1.0 / theta ** (np.arange(0, head_size, 2) / head_size)
    return inv_freq if scaling is None else llama3_scaled(inv_freq, **scaling)


def llama3_scaled(
    inv_freq: np.ndarray,
    factor: float,
    low_freq_factor: float,
    high_freq_factor: float,
    original_max_position_embeddings: float,
) -> np.ndarray:
    """Llama 3's rope scaling (HF's `_compute_llama3_parameters`): wavelengths shorter than original / high_freq_factor
    are kept, those longer than original / low_freq_factor divided by `factor`, and those between interpolated."""
    wavelength = 2 * np.pi / inv_freq
    low_freq_wavelength = original_max_position_embeddings / low_freq_factor
    high_freq_wavelength = original_max_position_embeddings / high_freq_factor
    scaled = np.where(wavelength > low_freq_wavelength, inv_freq / factor, inv_freq)
    smooth = (original_max_position_embeddings / wavelength - low_freq_factor) / (high_freq_factor - low_freq_factor)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = (wavelength >= high_freq_wavelength) & (wavelength <= low_freq_wavelength)
    return np.where(medium, smoothed, scaled)


def checked_rope_scaling(scaling: Any) -> dict[str, float] | None:
    """model.rope_scaling: null, or Llama 3's four settings (HF's `rope_type: llama3` may stay beside them)."""
    if scaling is None:
        return None
    if not isinstance(scaling, Mapping):
        raise ConfigError(f"model.rope_scaling={scaling!r} must be null or a mapping of {', '.join(ROPE_SCALING)}")
    if scaling.get("rope_type", "llama3") != "llama3":
        raise ConfigError(f"model.rope_scaling.rope_type={scaling['rope_type']}: only Llama 3's (llama3) is computed")
    given = {k: v for k, v in scaling.items() if k != "rope_type"}
    if set(given) != set(ROPE_SCALING):
        raise ConfigError(
            f"model.rope_scaling has {', '.join(sorted(given))}; Llama 3's needs {', '.join(ROPE_SCALING)}"
        )
    for key, value in given.items():
        if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
            raise ConfigError(f"model.rope_scaling.{key}={value!r}: must be a positive number")
    if given["high_freq_factor"] <= given["low_freq_factor"]:
        raise ConfigError(
            f"model.rope_scaling.high_freq_factor={given['high_freq_factor']} must be above low_freq_factor="
            f"{given['low_freq_factor']}: the frequencies between them are interpolated"
        )
    return {k: float(v) for k, v in given.items()}


def check_llama_sizes(d_model: int, heads: int, kv_heads: int, ffn: int, rope_theta: float, rms_eps: float) -> None:
    """One line for what a Llama cannot take beyond a decoder's sizes (check_sizes)."""
    require_positive(kv_heads=kv_heads, ffn=ffn)
    if heads % kv_heads:
        raise ConfigError(
            f"model.heads={heads} is not divisible by model.kv_heads={kv_heads}: each key/value head serves "
            "heads / kv_heads query heads"
        )
    if (d_model // heads) % 2:
        raise ConfigError(
            f"model.d_model / model.heads = {d_model // heads} is odd: rotary embeddings rotate a head's features in "
            "pairs, so the head size must be even"
        )
    if rope_theta <= 0 or rms_eps <= 0:
        raise ConfigError(f"model.rope_theta={rope_theta} and model.rms_eps={rms_eps} must be positive")


class Llama(CausalLM):
    name = "llama"
    spec: dict[str, tuple]  # always: set in __init__

    def __init__(
        self,
        layers: int = 2,
        d_model: int = 64,
        heads: int = 4,
        kv_heads: int = 2,
        ffn: int = 128,
        vocab_size: int = 512,
        context: int = 128,
        prompt_len: int = 16,
        rope_theta: float = 500000.0,
        rope_scaling: dict[str, float] | None = None,
        rms_eps: float = 1e-5,
        tie_embeddings: bool = False,
        qkv_bias: bool = False,
    ):
        check_sizes(layers, d_model, heads, vocab_size, context, prompt_len)
        check_llama_sizes(d_model, heads, kv_heads, ffn, rope_theta, rms_eps)
        self.layers, self.d_model, self.heads, self.kv_heads, self.ffn = layers, d_model, heads, kv_heads, ffn
        self.vocab_size, self.context, self.prompt_len = vocab_size, context, prompt_len
        self.rms_eps, self.tie_embeddings, self.qkv_bias = float(rms_eps), tie_embeddings, qkv_bias
        self.head_size = d_model // heads
        self.rope_theta, self.rope_scaling = float(rope_theta), checked_rope_scaling(rope_scaling)
        # Python floats: constants of every compiled step (torch.compile would take a NumPy array for an input)
        inv_freq = inverse_frequencies(self.head_size, self.rope_theta, self.rope_scaling)
        self.inv_freq: tuple[float, ...] = tuple(inv_freq.tolist())
        self.spec = llama_spec(layers, d_model, heads, kv_heads, ffn, vocab_size, tie_embeddings, qkv_bias)

    def init_params(self, rng: np.random.Generator) -> dict[str, np.ndarray]:
        """HF's initialisation, N(0, 0.02) for every matrix; biases N(0, 0.02) and the norms' weights mildly off 1, so
        that every parameter matters to the checks."""
        return {
            name: 1 + 0.1 * rng.standard_normal(shape)
            if name.endswith("norm.weight")
            else 0.02 * rng.standard_normal(shape)
            for name, shape in self.spec.items()
        }

    # -- a checkpoint as users have it ------------------------------------------------------------

    def read_weights(self, path: Path) -> dict[str, np.ndarray]:
        """model.weights=PATH, strictly: a weights file or a Hugging Face folder, whose config.json must agree."""
        from runner.models.checkpoints import read, strict_weights

        checkpoint = read(path)
        if checkpoint.config is not None and checkpoint.config_file is not None:
            self.check_hf_config(checkpoint.config, checkpoint.config_file)
        tied = {"lm_head.weight": "embed_tokens.weight"} if self.tie_embeddings else None
        return strict_weights(checkpoint, self.spec, self.name, lambda name: bool(HF_BUFFERS.fullmatch(name)), tied)

    def check_hf_config(self, config: Mapping[str, Any], source: Path) -> None:
        """Refuse (one line) a config.json of another model than a Llama or a Qwen2, other sizes than the run's, or
        other arithmetic."""
        family = config.get("model_type", "llama")
        if family not in ("llama", "qwen2"):
            raise ConfigError(f"{source}: model_type={family}, not a Llama or Qwen2 that model={self.name} runs")
        defaults = {hf: (mine, QWEN2_DEFAULTS.get(hf, default) if family == "qwen2" else default)
                    for hf, (mine, default) in HF_SIZES.items()}  # fmt: skip
        settings = [Setting(hf, config.get(hf, d), mine, getattr(self, mine), config.get(hf, d))
                    for hf, (mine, d) in defaults.items()]  # fmt: skip
        kv_heads = config.get("num_key_value_heads", config.get("num_attention_heads", 32))
        settings.append(Setting("num_key_value_heads", kv_heads, "kv_heads", self.kv_heads, kv_heads))
        settings += self._rope_settings(config, source)
        if family == "qwen2":  # q, k and v biases, always
            settings.append(Setting("model_type", family, "qkv_bias", self.qkv_bias, True))
        elif not config.get("attention_bias", False):  # a Llama's attention biases include o_proj's: _hf_arithmetic
            settings.append(Setting("attention_bias", False, "qkv_bias", self.qkv_bias, False))
        check_config(source, self.name, settings, self._hf_arithmetic(family), config)
        trained = config.get("max_position_embeddings", TRAINED_POSITIONS[family])
        if self.context > trained:
            raise ConfigError(
                f"{source}: max_position_embeddings={trained}, but model.context={self.context}: positions past "
                f"{trained} are beyond what the checkpoint was trained for; run with model.context={trained} or less"
            )

    def _rope_settings(self, config: Mapping[str, Any], source: Path) -> list[Setting]:
        """The rotary base and Llama 3's scaling as transformers 5 writes them (`rope_parameters`) or as before
        (`rope_theta`, `rope_scaling`)."""
        if isinstance(config.get("rope_parameters"), Mapping):
            rope, theta_key, scaling_key = config["rope_parameters"], "rope_parameters.rope_theta", "rope_parameters"
        else:
            rope = {**(config.get("rope_scaling") or {}), "rope_theta": config.get("rope_theta", 10000.0)}
            theta_key, scaling_key = "rope_theta", "rope_scaling"
        kind = rope.get("rope_type", rope.get("type", "default"))
        if kind not in ("default", "llama3"):
            raise ConfigError(
                f"{source}: {scaling_key}.rope_type={kind}, but model={self.name} computes rotary embeddings without "
                "scaling (default) or with Llama 3's (llama3)"
            )
        scaling = {k: rope.get(k) for k in ROPE_SCALING} if kind == "llama3" else None
        shown = {k: v for k, v in rope.items() if k != "rope_theta"} if kind == "llama3" else None
        return [
            Setting(theta_key, rope["rope_theta"], "rope_theta", self.rope_theta, rope["rope_theta"]),
            Setting(scaling_key, shown, "rope_scaling", self.rope_scaling, scaling),
        ]

    def _hf_arithmetic(self, family: str) -> dict[str, tuple[Any, tuple, str]]:
        """{LlamaConfig / Qwen2Config key: (its default, the values this model computes, what it computes)}."""
        arithmetic = {
            "hidden_act": ("silu", ("silu",), "a SiLU-gated MLP (silu)"),
            "mlp_bias": (False, (False,), "an MLP without biases"),
            "head_dim": (None, (None, self.head_size), f"heads of d_model / heads = {self.head_size} features"),
        }
        if family == "llama":
            arithmetic["attention_bias"] = (False, (False,), "no o_proj bias (q, k, v biases alone: Qwen2's)")
        else:
            arithmetic["use_sliding_window"] = (False, (False,), "full attention in every layer, no sliding window")
        return arithmetic

    # -- written once, run on every backend's ops (CausalLM's forward and step call these) ------------

    def _embed(self, ops: Any, params: dict, ids: Any, where: Any, pad: Any = None) -> Any:
        return ops.embed(params["embed_tokens.weight"], ids)

    def _at(self, ops: Any, where: Any, h: Any, keys: int, pad: Any = None) -> tuple[Any, Any]:
        """The attention mask and the rotary embedding's (cos, sin) at the step's positions, for every layer."""
        return super()._at(ops, where, h, keys, pad), ops.rotary_angles(self.inv_freq, where, h, pad)

    def _block(self, ops: Any, p: dict, i: int, x: Any, cache: Any, where: Any, at: Any) -> tuple[Any, Any]:
        n = f"layers.{i}."
        attended, kv = self._attention(ops, p, n, ops.rms_norm(x, p[n + "input_layernorm.weight"], self.rms_eps),
                                       cache, where, at)  # fmt: skip
        x = x + ops.project(attended, p[n + "self_attn.o_proj.weight"])
        h = ops.rms_norm(x, p[n + "post_attention_layernorm.weight"], self.rms_eps)
        h = ops.silu(ops.project(h, p[n + "mlp.gate_proj.weight"])) * ops.project(h, p[n + "mlp.up_proj.weight"])
        return x + ops.project(h, p[n + "mlp.down_proj.weight"]), kv

    def _attention(self, ops: Any, p: dict, n: str, h: Any, cache: Any, where: Any, at: Any) -> tuple[Any, Any]:
        """Grouped-query attention of layer n's normalised input h: (its output (batch, seq, d), its keys, values)."""
        mask, angles = at
        q, k, v = (
            ops.to_heads(ops.project(h, p[f"{n}self_attn.{name}.weight"], p.get(f"{n}self_attn.{name}.bias")), heads)
            for name, heads in (("q_proj", self.heads), ("k_proj", self.kv_heads), ("v_proj", self.kv_heads))
        )
        q, k = ops.rotary(q, angles), ops.rotary(k, angles)
        if cache is not None:  # this step's keys and values join those before them
            k, v = ops.write_cache(cache[0], k, where), ops.write_cache(cache[1], v, where)
        groups = self.heads // self.kv_heads
        shared = (ops.repeat_heads(k, groups), ops.repeat_heads(v, groups)) if groups > 1 else (k, v)
        return ops.merge_heads(ops.attention(q, *shared, mask)), (k, v)

    def _logits(self, ops: Any, params: dict, h: Any) -> Any:
        head = params["embed_tokens.weight" if self.tie_embeddings else "lm_head.weight"]
        return ops.project(ops.rms_norm(h, params["norm.weight"], self.rms_eps), head)

    def row_tables(self) -> tuple[str, ...]:
        return () if self.tie_embeddings else ("embed_tokens.weight",)  # tied: read whole as the head

    def cache_shape(self, batch_size: int, length: int) -> tuple[int, int, int, int]:
        """One layer's keys (or values): (batch, kv_heads, length, head size)."""
        return batch_size, self.kv_heads, length, self.head_size

    # -- sizes: the memory check and the cost note ------------------------------------------

    def generation_elements(self, batch_size: int, length: int, new_tokens: int) -> dict[str, int]:
        """Weights, the prompt, each step's logits kept for the check, the cache of `length` positions (counted as
        activations: what the generation holds meanwhile) and one layer's activations over the prompt (its keys and
        values repeated to the query heads among them)."""
        weights = sum(int(np.prod(shape)) for shape in self.spec.values())
        tokens = batch_size * self.prompt_len
        cache = self.layers * 2 * int(np.prod(self.cache_shape(batch_size, length)))
        repeated = 2 * batch_size * self.heads * length * self.head_size
        scores = 2 * batch_size * self.heads * self.prompt_len * length
        layer = tokens * (6 * self.d_model + 3 * self.ffn) + repeated + scores
        logits = batch_size * max(new_tokens, self.prompt_len) * self.vocab_size
        return {"weights": weights, "inputs": tokens, "results": logits, "activations": cache + layer}

    def generation_flops(self, batch_size: int, prompt_len: int, new_tokens: int) -> float:
        """Multiply-adds x 2 of the prefill and each new token (attention over the whole cache buffer)."""
        d, length = self.d_model, prompt_len + new_tokens
        projections = 2 * d * d + 2 * d * self.kv_heads * self.head_size + 3 * d * self.ffn
        per_token = self.layers * (2 * projections + 4 * length * d) + 2 * d * self.vocab_size
        return float(batch_size * per_token * (prompt_len + max(new_tokens - 1, 0)))

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
q_proj, k_proj and v_proj biases), `o_bias` and `mlp_bias`. The variants of the family: a head size apart from d_model /
heads (`head_dim`), Qwen3's q/k RMSNorm (`qk_norm`), rope scaling of runner.models.rope's kinds, and a sliding window
(`sliding_window`, in the layers from `full_attention_layers` on) in the attention mask.

Weights carry the names and layout of HF's LlamaForCausalLM state dict without its `model.` prefix
(`layers.0.self_attn.q_proj.weight`, (out, in) as torch.nn.Linear's), kept as they are on every backend, so
`model.weights=` takes a Llama or Qwen2 checkpoint as users have it, a file or a Hugging Face folder, read strictly
(`read_weights`: runner.models.checkpoints): names under `model.` are found, `lm_head.weight` where the head is untied
(or a copy equal to the embedding where it is tied), every key must be used, and a folder's config.json must describe
this model at the run's settings (`check_hf_config`); a run of such a folder takes the settings its command line
leaves from config.json (runner.models.llama_checkpoint, runner.models.checkpoints.from_checkpoint).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from runner.config import ConfigError, require_positive
from runner.models.causal_lm import CausalLM, check_sizes
from runner.models.checkpoints import Setting, check_config, override
from runner.models.llama_checkpoint import settings_of
from runner.models.rope import attention_factor, checked_rope_scaling, inverse_frequencies

# transformers before 4.31 saved each layer's rotary inverse frequencies: a constant the model computes, not a weight
HF_BUFFERS = re.compile(r"(layers\.\d+\.self_attn\.)?rotary_emb\.inv_freq")


def llama_spec(
    layers: int, d_model: int, heads: int, kv_heads: int, ffn: int, vocab_size: int, tied: bool, **variant: Any
) -> dict[str, tuple]:
    """{LlamaForCausalLM's state-dict name without `model.`: shape}; lm_head only when the head is not tied; `variant`:
    head_dim (its size where not d_model / heads), qkv_bias, o_bias, mlp_bias and qk_norm (Llama's own settings)."""
    size = variant.get("head_dim") or d_model // heads
    spec: dict[str, tuple] = {"embed_tokens.weight": (vocab_size, d_model)}
    for i in range(layers):
        p = f"layers.{i}."
        spec[p + "input_layernorm.weight"] = (d_model,)
        for name, out in (("q_proj", heads * size), ("k_proj", kv_heads * size), ("v_proj", kv_heads * size)):
            spec[p + f"self_attn.{name}.weight"] = (out, d_model)
            if variant.get("qkv_bias"):
                spec[p + f"self_attn.{name}.bias"] = (out,)
        spec[p + "self_attn.o_proj.weight"] = (d_model, heads * size)
        if variant.get("o_bias"):
            spec[p + "self_attn.o_proj.bias"] = (d_model,)
        if variant.get("qk_norm"):
            spec[p + "self_attn.q_norm.weight"] = spec[p + "self_attn.k_norm.weight"] = (size,)
        spec[p + "post_attention_layernorm.weight"] = (d_model,)
        spec[p + "mlp.gate_proj.weight"] = spec[p + "mlp.up_proj.weight"] = (ffn, d_model)
        spec[p + "mlp.down_proj.weight"] = (d_model, ffn)
        if variant.get("mlp_bias"):
            spec[p + "mlp.gate_proj.bias"] = spec[p + "mlp.up_proj.bias"] = (ffn,)
            spec[p + "mlp.down_proj.bias"] = (d_model,)
    spec["norm.weight"] = (d_model,)
    if not tied:
        spec["lm_head.weight"] = (vocab_size, d_model)
    return spec


def check_llama_sizes(heads: int, kv_heads: int, ffn: int, head_size: int, rope_theta: float, rms_eps: float) -> None:
    """One line for what a Llama cannot take beyond a decoder's sizes (check_sizes)."""
    require_positive(kv_heads=kv_heads, ffn=ffn, head_size=head_size)
    if heads % kv_heads:
        raise ConfigError(
            f"model.heads={heads} is not divisible by model.kv_heads={kv_heads}: each key/value head serves "
            "heads / kv_heads query heads"
        )
    if head_size % 2:
        raise ConfigError(
            f"the head size (model.head_dim, or model.d_model / model.heads) is {head_size}, odd: rotary embeddings "
            "rotate a head's features in pairs, so it must be even"
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
        rope_scaling: dict[str, Any] | None = None,
        rms_eps: float = 1e-5,
        tie_embeddings: bool = False,
        qkv_bias: bool = False,
        head_dim: int | None = None,
        o_bias: bool = False,
        mlp_bias: bool = False,
        qk_norm: bool = False,
        sliding_window: int | None = None,
        full_attention_layers: int = 0,
    ):
        check_sizes(layers, d_model, heads, vocab_size, context, prompt_len)
        self.head_size = head_dim or d_model // heads
        check_llama_sizes(heads, kv_heads, ffn, self.head_size, rope_theta, rms_eps)
        if sliding_window is not None:
            require_positive(sliding_window=sliding_window)
        self.layers, self.d_model, self.heads, self.kv_heads, self.ffn = layers, d_model, heads, kv_heads, ffn
        self.vocab_size, self.context, self.prompt_len = vocab_size, context, prompt_len
        self.rms_eps, self.tie_embeddings, self.qkv_bias = float(rms_eps), tie_embeddings, qkv_bias
        self.head_dim = None if self.head_size == d_model // heads else self.head_size
        self.o_bias, self.mlp_bias, self.qk_norm, self.sliding_window = o_bias, mlp_bias, qk_norm, sliding_window
        self.full_attention_layers = full_attention_layers  # the layers before the sliding window's (Qwen's)
        self.rope_theta, self.rope_scaling = float(rope_theta), checked_rope_scaling(rope_scaling)
        # Python floats: constants of every compiled step (torch.compile would take a NumPy array for an input)
        inv_freq = inverse_frequencies(self.head_size, self.rope_theta, self.rope_scaling)
        self.inv_freq: tuple[float, ...] = tuple(inv_freq.tolist())
        self.attention_factor = attention_factor(self.rope_scaling)
        self.spec = llama_spec(layers, d_model, heads, kv_heads, ffn, vocab_size, tie_embeddings, **self.variant())
        self.config_source: str | None = None  # the config.json the weights came with
        self.unchecked: str | None = None  # the weights file without one, whose settings could not be checked
        self.check_length(prompt_len, "model.prompt_len")

    def variant(self) -> dict[str, Any]:
        """What this Llama computes beyond Llama 2's arithmetic (llama_spec's `variant`)."""
        return {"head_dim": self.head_dim, "qkv_bias": self.qkv_bias, "o_bias": self.o_bias,
                "mlp_bias": self.mlp_bias, "qk_norm": self.qk_norm}  # fmt: skip

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

    @staticmethod
    def settings_of_config(config: Mapping[str, Any], source: Path) -> list[Setting]:
        """The settings a Llama-family config.json sets (runner.models.llama_checkpoint): what a run of model.weights=
        FOLDER takes where its command line leaves them (runner.models.checkpoints.from_checkpoint)."""
        return settings_of(config, source)

    @staticmethod
    def comparable(model: Mapping[str, Any]) -> dict[str, Any]:
        """model.* settings as config.json's are compared with them (the attributes a Llama keeps of them)."""
        ran = dict(model)
        ran["rope_scaling"] = checked_rope_scaling(model.get("rope_scaling"))
        ran["rope_theta"], ran["rms_eps"] = float(model["rope_theta"]), float(model["rms_eps"])
        if model.get("head_dim") == model["d_model"] // model["heads"]:
            ran["head_dim"] = None
        return ran

    def read_weights(self, path: Path) -> dict[str, np.ndarray]:
        """model.weights=PATH, strictly: a weights file or a Hugging Face folder, whose config.json must agree."""
        from runner.models.checkpoints import read, strict_weights

        checkpoint = read(path)
        if checkpoint.config is not None and checkpoint.config_file is not None:
            self.check_hf_config(checkpoint.config, checkpoint.config_file)
            self.config_source = str(checkpoint.config_file)
        else:
            self.unchecked = str(checkpoint.weights_file)
        tied = {"lm_head.weight": "embed_tokens.weight"} if self.tie_embeddings else None
        return strict_weights(checkpoint, self.spec, self.name, lambda name: bool(HF_BUFFERS.fullmatch(name)), tied)

    def check_hf_config(self, config: Mapping[str, Any], source: Path) -> None:
        """Refuse (one line) a config.json of another model than a Llama, Qwen2, Qwen3 or Mistral, other settings than
        the run's, or other arithmetic."""
        check_config(source, [replace(s, run=getattr(self, s.setting)) for s in settings_of(config, source, self.name)])

    def describe(self, ops: Any, params: dict, inputs: dict, backward: bool) -> dict[str, str]:
        """Where the model's settings come from, for result.json's environment."""
        if self.config_source is not None:
            return {"model_settings": f"from {self.config_source} (model.* typed agree with it)"}
        if self.unchecked is not None:
            return {"model_settings": self._unchecked_line()}
        return {}

    def run_warnings(self) -> list[str]:
        return [self._unchecked_line()] if self.unchecked is not None else []

    def _unchecked_line(self) -> str:
        return (
            f"model.weights={self.unchecked} has no config.json: the heads (model.heads={self.heads}, kv_heads="
            f"{self.kv_heads}, head size {self.head_size}), rope (model.rope_theta={self.rope_theta}, rope_scaling="
            f"{override(self.rope_scaling)}) and norm (model.rms_eps={self.rms_eps}) settings are this run's own and "
            "could not be checked against the weights (their shapes were)"
        )

    def check_length(self, length: int, setting: str) -> None:
        """Refuse a sequence longer than the model's positions, or than dynamic rope scaling's original positions."""
        super().check_length(length, setting)
        scaling = self.rope_scaling or {}
        if scaling.get("rope_type") == "dynamic" and length > scaling["original_max_position_embeddings"]:
            raise ConfigError(
                f"{setting}: {length} tokens, past the {int(scaling['original_max_position_embeddings'])} positions "
                "after which dynamic rope scaling changes its frequencies at each step, which is not computed; lower "
                "them to that or fewer"
            )

    # -- written once, run on every backend's ops (CausalLM's forward and step call these) ------------

    def _embed(self, ops: Any, params: dict, ids: Any, where: Any, pad: Any = None) -> Any:
        return ops.embed(params["embed_tokens.weight"], ids)

    def _at(self, ops: Any, where: Any, h: Any, keys: int, pad: Any = None) -> tuple[Any, Any]:
        """The attention mask and the rotary embedding's (cos, sin) at the step's positions, for every layer."""
        cos, sin = ops.rotary_angles(self.inv_freq, where, h, pad)
        if self.attention_factor != 1.0:  # YaRN's: cos and sin scaled
            cos, sin = cos * self.attention_factor, sin * self.attention_factor
        mask = super()._at(ops, where, h, keys, pad)
        if self.sliding_window is None or self.sliding_window >= keys:  # a window every key fits changes nothing
            return (mask, mask), (cos, sin)
        # a query at position p sees the keys after p - window: not those a causal mask `window` places back sees
        return (mask, mask & ~ops.attention_mask(where - self.sliding_window, h.shape[1], keys)), (cos, sin)

    def _block(self, ops: Any, p: dict, i: int, x: Any, cache: Any, where: Any, at: Any) -> tuple[Any, Any]:
        n = f"layers.{i}."
        (full, windowed), angles = at
        mask = full if i < self.full_attention_layers else windowed
        attended, kv = self._attention(ops, p, n, ops.rms_norm(x, p[n + "input_layernorm.weight"], self.rms_eps),
                                       cache, where, (mask, angles))  # fmt: skip
        x = x + ops.project(attended, p[n + "self_attn.o_proj.weight"], p.get(n + "self_attn.o_proj.bias"))
        h = ops.rms_norm(x, p[n + "post_attention_layernorm.weight"], self.rms_eps)
        gate, up = (ops.project(h, p[f"{n}mlp.{name}.weight"], p.get(f"{n}mlp.{name}.bias")) for name in ("gate_proj",
                    "up_proj"))  # fmt: skip
        return x + ops.project(ops.silu(gate) * up, p[n + "mlp.down_proj.weight"], p.get(n + "mlp.down_proj.bias")), kv

    def _attention(self, ops: Any, p: dict, n: str, h: Any, cache: Any, where: Any, at: Any) -> tuple[Any, Any]:
        """Grouped-query attention of layer n's normalised input h: (its output (batch, seq, d), its keys, values)."""
        mask, angles = at
        q, k, v = (
            ops.to_heads(ops.project(h, p[f"{n}self_attn.{name}.weight"], p.get(f"{n}self_attn.{name}.bias")), heads)
            for name, heads in (("q_proj", self.heads), ("k_proj", self.kv_heads), ("v_proj", self.kv_heads))
        )
        if self.qk_norm:  # Qwen3: each head's queries and keys RMS-normalised before they are turned
            q = ops.rms_norm(q, p[n + "self_attn.q_norm.weight"], self.rms_eps)
            k = ops.rms_norm(k, p[n + "self_attn.k_norm.weight"], self.rms_eps)
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
        projections = 2 * d * (self.heads + self.kv_heads) * self.head_size + 3 * d * self.ffn
        per_token = self.layers * (2 * projections + 4 * length * d) + 2 * d * self.vocab_size
        return float(batch_size * per_token * (prompt_len + max(new_tokens - 1, 0)))

"""A GPT-2 language model, written once against the op families `attention`, `decoder` (model=gpt2, task=generate).

    ids (batch, seq) token ids
    x = wte[ids] + wpe[positions]                                       token and learned position embeddings
    for each layer i:  x = x + c_proj(attention(c_attn(ln_1(x))))      causal multi-head self-attention
                       x = x + mlp.c_proj(gelu_tanh(mlp.c_fc(ln_2(x))))  GPT-2's GELU: the tanh approximation
    logits = ln_f(x) @ wte.T                                            the head tied to the token embedding

Weights carry GPT-2's own names and layout (its checkpoint's `h.0.attn.c_attn.weight` is (in, out), a Conv1D), kept
as they are on every backend (`own_layout`), so `model.weights=` takes GPT-2's checkpoint as users have it: a file
(torch, safetensors, HDF5) or a Hugging Face folder (`save_pretrained`'s), read strictly (`read_weights`:
runner.models.checkpoints): names under `transformer.` are found, every key must be used, and a folder's config.json
must describe this model at the run's sizes.

Generation keeps a key/value cache of fixed shape, (batch, heads, context, head size) per layer and for keys and
values, written at each step's positions; attention runs over the whole buffer with the positions not yet written
masked, as static caches do (HF's StaticCache, keras_hub's), so a compiled decode step has one shape for every token.
Without a cache (`forward`), the same attention runs over the sequence's own keys and values.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from runner.config import ConfigError
from runner.models.causal_lm import CausalLM, check_sizes
from runner.models.checkpoints import Setting, check_arithmetic, check_config

# config.json's sizes (GPT2Config's names) -> (this model's setting, GPT2Config's default where config.json omits it)
HF_SIZES = {
    "n_layer": ("layers", 12),
    "n_embd": ("d_model", 768),
    "n_head": ("heads", 12),
    "vocab_size": ("vocab_size", 50257),
    "n_positions": ("context", 1024),
}
# HF's GPT-2 saved each layer's causal mask (attn.bias) and masked score (attn.masked_bias) as buffers until
# transformers 4.3x: constants of the causal attention every backend computes itself, not weights
HF_BUFFERS = re.compile(r"h\.\d+\.attn\.(bias|masked_bias)")
TIED = {"lm_head.weight": "wte.weight"}  # the head a checkpoint may carry, which GPT-2 ties to the token embedding


def gpt2_spec(layers: int, d_model: int, vocab_size: int, context: int) -> dict[str, tuple]:
    """{GPT-2 checkpoint name: shape}: embeddings, the blocks, the final norm (the head is the token embedding)."""
    spec: dict[str, tuple] = {"wte.weight": (vocab_size, d_model), "wpe.weight": (context, d_model)}
    for i in range(layers):
        p = f"h.{i}."
        for norm in ("ln_1", "ln_2"):
            spec[p + f"{norm}.weight"] = spec[p + f"{norm}.bias"] = (d_model,)
        spec[p + "attn.c_attn.weight"], spec[p + "attn.c_attn.bias"] = (d_model, 3 * d_model), (3 * d_model,)
        spec[p + "attn.c_proj.weight"], spec[p + "attn.c_proj.bias"] = (d_model, d_model), (d_model,)
        spec[p + "mlp.c_fc.weight"], spec[p + "mlp.c_fc.bias"] = (d_model, 4 * d_model), (4 * d_model,)
        spec[p + "mlp.c_proj.weight"], spec[p + "mlp.c_proj.bias"] = (4 * d_model, d_model), (d_model,)
    spec["ln_f.weight"] = spec["ln_f.bias"] = (d_model,)
    return spec


class Decoder(CausalLM):
    name = "gpt2"
    spec: dict[str, tuple]  # always: set in __init__

    def __init__(
        self,
        layers: int = 2,
        d_model: int = 64,
        heads: int = 4,
        vocab_size: int = 512,
        context: int = 128,
        prompt_len: int = 16,
    ):
        check_sizes(layers, d_model, heads, vocab_size, context, prompt_len)
        self.layers, self.d_model, self.heads = layers, d_model, heads
        self.vocab_size, self.context, self.prompt_len = vocab_size, context, prompt_len
        self.spec = gpt2_spec(layers, d_model, vocab_size, context)

    def init_params(self, rng: np.random.Generator) -> dict[str, np.ndarray]:
        """GPT-2's initialisation: N(0, 0.02), the residual branches' last projections scaled by 1/sqrt(2 layers);
        biases and norms mildly off their defaults, so every parameter matters to the checks."""
        residual_scale = 1 / np.sqrt(2 * self.layers)
        params = {}
        for name, shape in self.spec.items():
            if len(shape) == 2:
                scale = residual_scale if name.endswith("c_proj.weight") else 1.0
                params[name] = 0.02 * scale * rng.standard_normal(shape)
            elif name.endswith("weight"):  # a norm's scale
                params[name] = 1 + 0.1 * rng.standard_normal(shape)
            else:
                params[name] = 0.02 * rng.standard_normal(shape)
        return params

    def read_weights(self, path: Path) -> dict[str, np.ndarray]:
        """model.weights=PATH, strictly: a weights file or a Hugging Face folder, whose config.json must agree."""
        from runner.models.checkpoints import read, strict_weights

        checkpoint = read(path)
        if checkpoint.config is not None and checkpoint.config_file is not None:
            self.check_hf_config(checkpoint.config, checkpoint.config_file)
        return strict_weights(checkpoint, self.spec, self.name, lambda name: bool(HF_BUFFERS.fullmatch(name)), TIED)

    def check_hf_config(self, config: Mapping[str, Any], source: Path) -> None:
        """Refuse (one line) a config.json of another model, other sizes than the run's, or other arithmetic. Sizes are
        not taken from it: the run's model.* settings are what its record keeps, so they must be the checkpoint's."""
        if config.get("model_type", "gpt2") != "gpt2":
            raise ConfigError(f"{source}: model_type={config['model_type']}, not a GPT-2 that model={self.name} runs")
        settings = [
            Setting(hf, config.get(hf, default), mine, getattr(self, mine), config.get(hf, default))
            for hf, (mine, default) in HF_SIZES.items()
        ]
        check_config(source, settings)
        check_arithmetic(source, self.name, self._hf_arithmetic(), config)

    def _hf_arithmetic(self) -> dict[str, tuple[Any, tuple, str]]:
        """{GPT2Config key: (its default, the values this model computes, what it computes)}."""
        return {
            "activation_function": ("gelu_new", ("gelu_new", "gelu_pytorch_tanh"), "GPT-2's tanh GELU (gelu_new)"),
            "layer_norm_epsilon": (1e-5, (1e-5,), "layer norms with eps 1e-5"),
            "n_inner": (None, (None, 4 * self.d_model), f"an MLP of 4 d_model = {4 * self.d_model} features"),
            "scale_attn_weights": (True, (True,), "attention scores scaled by 1/sqrt(head size)"),
            "scale_attn_by_inverse_layer_idx": (False, (False,), "the same attention scale in every layer"),
            "add_cross_attention": (False, (False,), "no cross-attention"),
        }

    def _embed(self, ops: Any, params: dict, ids: Any, where: Any, pad: Any = None) -> Any:
        return ops.embed(params["wte.weight"], ids) + ops.positions_embedded(params["wpe.weight"], where, ids, pad)

    def _block(self, ops: Any, p: dict, i: int, x: Any, cache: Any, where: Any, mask: Any) -> tuple[Any, Any]:
        n = f"h.{i}."
        h = ops.layer_norm(x, p[n + "ln_1.weight"], p[n + "ln_1.bias"])
        q, k, v = ops.split_heads(ops.affine(h, p[n + "attn.c_attn.weight"], p[n + "attn.c_attn.bias"]), self.heads)
        if cache is not None:  # this step's keys and values join those before them
            k, v = ops.write_cache(cache[0], k, where), ops.write_cache(cache[1], v, where)
        attended = ops.merge_heads(ops.attention(q, k, v, mask))
        x = x + ops.affine(attended, p[n + "attn.c_proj.weight"], p[n + "attn.c_proj.bias"])
        h = ops.layer_norm(x, p[n + "ln_2.weight"], p[n + "ln_2.bias"])
        h = ops.gelu_tanh(ops.affine(h, p[n + "mlp.c_fc.weight"], p[n + "mlp.c_fc.bias"]))
        return x + ops.affine(h, p[n + "mlp.c_proj.weight"], p[n + "mlp.c_proj.bias"]), (k, v)

    def _logits(self, ops: Any, params: dict, h: Any) -> Any:
        return ops.unembed(ops.layer_norm(h, params["ln_f.weight"], params["ln_f.bias"]), params["wte.weight"])

    def row_tables(self) -> tuple[str, ...]:
        return ("wpe.weight",)  # wte is the head too: read whole

    def cache_shape(self, batch_size: int, length: int) -> tuple[int, int, int, int]:
        """One layer's keys (or values): (batch, heads, length, head size)."""
        return batch_size, self.heads, length, self.d_model // self.heads

    def generation_elements(self, batch_size: int, length: int, new_tokens: int) -> dict[str, int]:
        """Weights, the prompt, each step's logits kept for the check, the cache of `length` positions (counted as
        activations: what the generation holds meanwhile) and one layer's activations over the prompt."""
        weights = sum(int(np.prod(shape)) for shape in self.spec.values())
        tokens = batch_size * self.prompt_len
        cache = self.layers * 2 * int(np.prod(self.cache_shape(batch_size, length)))
        layer = tokens * 12 * self.d_model + 2 * batch_size * self.heads * self.prompt_len * length
        logits = batch_size * max(new_tokens, self.prompt_len) * self.vocab_size
        return {"weights": weights, "inputs": tokens, "results": logits, "activations": cache + layer}

    def generation_flops(self, batch_size: int, prompt_len: int, new_tokens: int) -> float:
        """Multiply-adds x 2 of the prefill and each new token (attention over the whole cache buffer)."""
        d, length = self.d_model, prompt_len + new_tokens
        per_token = self.layers * (2 * 12 * d * d + 4 * length * d) + 2 * d * self.vocab_size
        return float(batch_size * per_token * (prompt_len + max(new_tokens - 1, 0)))

"""keras_hub's Llama (`model=keras_hub_llama`): the same model as `model=llama`, a second implementation of it, for
task=generate and task=inference on Keras 3's TensorFlow, torch and JAX backends (what keras_hub's causal LMs share:
runner.models.keras_hub_causal_lm).

The network is keras_hub's `Llama3CausalLM` on a `Llama3Backbone` of the config's sizes, without a preprocessor.
keras_hub 0.32's Llama3 classes are its Llama classes under Llama 3's name (the same layers and arithmetic: subclasses
adding nothing but presets, tokenizer and preprocessor): grouped-query attention (`num_key_value_heads`), the rotary
base (`rope_max_wavelength`), Llama 3's rope scaling (`rope_frequency_adjustment_factor`, `rope_low_freq_factor`,
`rope_high_freq_factor`, `rope_pretraining_sequence_length`: HF's `llama3` rope type), RMSNorm's epsilon and a tied
or untied head (`tie_word_embeddings`). Llama 3's name is used because those settings are Llama 3's.

Its weights are model=llama's (LlamaForCausalLM's names and (out, in) layout), written into the Keras variables by
`keras_weights`: q_proj (heads x head size, d) becomes the query kernel (d, heads, head size), o_proj (d, heads x head
size) the output kernel (heads, head size, d), the MLP's matrices transposed, an untied lm_head (vocab, d) the
embedding's reverse_embeddings (d, vocab).

What keras_hub's Llama lacks is refused in one line: Qwen2's q/k/v biases (model.qkv_bias=true; its attention has
none). It computes RMSNorm, SiLU, the rotary angles (from float32 inverse frequencies) and the attention's softmax in
float32 whatever the dtype, so a float64 run would be float64 in name only: the yaml runs float32, checked within
float32's tolerance of the runner's float64 NumPy reference (CausalLM.reference_logits).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from runner.config import ConfigError
from runner.models.checkpoints import override
from runner.models.keras_hub_causal_lm import KerasHubCausalLM
from runner.models.llama import Llama

# {Keras sublayer variable of transformer_layer_i: LlamaForCausalLM matrix of layers.i, transposed}
TRANSPOSED = {
    "feedforward_gate_dense/kernel": "mlp.gate_proj.weight",
    "feedforward_intermediate_dense/kernel": "mlp.up_proj.weight",
    "feedforward_output_dense/kernel": "mlp.down_proj.weight",
}
NORMS = {
    "self_attention_layernorm/scale": "input_layernorm.weight",
    "feedforward_layernorm/scale": "post_attention_layernorm.weight",
}
# keras_hub's rope settings from model.rope_scaling's (Llama 3's; keras_hub's position scaling stays 1)
ROPE_SETTINGS = {
    "rope_frequency_adjustment_factor": "factor",
    "rope_low_freq_factor": "low_freq_factor",
    "rope_high_freq_factor": "high_freq_factor",
    "rope_pretraining_sequence_length": "original_max_position_embeddings",
}


class KerasHubLlama(KerasHubCausalLM, Llama):
    """model=llama's spec, seeded weights, prompt and size checks; keras_hub's Llama3CausalLM computes."""

    name = "keras_hub_llama"
    lm_class = "Llama3CausalLM"

    def __init__(
        self,
        backend_module: str,
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
        dtype: str = "float32",
        **variant: Any,
    ):
        if qkv_bias:
            raise ConfigError(
                "model.qkv_bias=true (Qwen2's q/k/v biases): keras_hub's Llama has no attention biases; "
                "allowed: model.qkv_bias=false (model=llama computes them)"
            )
        super().__init__(layers, d_model, heads, kv_heads, ffn, vocab_size, context, prompt_len, rope_theta,
                         rope_scaling, rms_eps, tie_embeddings, qkv_bias, **variant)  # fmt: skip
        computed = {"head_dim": None, "o_bias": False, "mlp_bias": False, "qk_norm": False, "sliding_window": None,
                    "full_attention_layers": 0}  # fmt: skip
        other = [f"model.{k}={override(v)}" for k, v in variant.items() if computed.get(k, v) != v]
        kind = (self.rope_scaling or {}).get("rope_type", "llama3")
        if other or kind != "llama3":
            said = ", ".join(other) or f"model.rope_scaling.rope_type={kind}"
            raise ConfigError(f"{said}: keras_hub's Llama3Backbone does not compute it (model=llama does)")
        self._keras_hub_setup(backend_module, dtype)

    # -- the mapping: LlamaForCausalLM's names and layout -> keras_hub's variables ----------------------------

    def keras_weights(self, params: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """{keras_hub variable path: value} from model=llama's parameters (numpy)."""
        weights = {
            "token_embedding/embeddings": params["embed_tokens.weight"],
            "sequence_output_layernorm/scale": params["norm.weight"],
        }
        if not self.tie_embeddings:  # keras_hub's untied head: the embedding's reverse, (d, vocab)
            weights["token_embedding/reverse_embeddings"] = params["lm_head.weight"].T
        for i in range(self.layers):
            weights.update(self._layer_weights(params, i))
        return weights

    def _layer_weights(self, params: dict[str, np.ndarray], i: int) -> dict[str, np.ndarray]:
        d, size = self.d_model, self.head_size
        llama, keras = f"layers.{i}.", f"transformer_layer_{i}/"
        weights: dict[str, np.ndarray] = {}
        projections = {"query": ("q", self.heads), "key": ("k", self.kv_heads), "value": ("v", self.kv_heads)}
        for part, (proj, heads) in projections.items():
            kernel = params[f"{llama}self_attn.{proj}_proj.weight"].T  # its columns: the heads, head by head
            weights[f"{keras}self_attention/{part}/kernel"] = kernel.reshape(d, heads, size)
        output = params[f"{llama}self_attn.o_proj.weight"].T  # its input rows: the heads merged, head by head
        weights[f"{keras}self_attention/attention_output/kernel"] = output.reshape(self.heads, size, d)
        weights.update({keras + name: params[llama + own].T for name, own in TRANSPOSED.items()})
        weights.update({keras + name: params[llama + own] for name, own in NORMS.items()})
        return weights

    def _causal_lm(self, keras_hub: Any) -> Any:
        scaling = self.rope_scaling or {}
        backbone = keras_hub.models.Llama3Backbone(
            vocabulary_size=self.vocab_size,
            num_layers=self.layers,
            num_query_heads=self.heads,
            num_key_value_heads=self.kv_heads,
            hidden_dim=self.d_model,
            intermediate_dim=self.ffn,
            rope_max_wavelength=self.rope_theta,
            layer_norm_epsilon=self.rms_eps,
            tie_word_embeddings=self.tie_embeddings,
            dropout=0,
            dtype=self.dtype,
            **{setting: scaling[own] for setting, own in ROPE_SETTINGS.items() if scaling},
        )
        return keras_hub.models.Llama3CausalLM(backbone=backbone, preprocessor=None, dtype=self.dtype)

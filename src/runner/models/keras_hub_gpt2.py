"""keras_hub's GPT-2 (`model=gpt2_keras_hub`): the same model as `model=gpt2`, a second implementation of it, for
task=generate and task=inference on Keras 3's TensorFlow, torch and JAX backends (what keras_hub's causal LMs share:
runner.models.keras_hub_causal_lm).

The network is keras_hub's own: `keras_hub.models.GPT2Backbone` at the config's sizes (intermediate size 4 d_model,
no dropout) under `keras_hub.models.GPT2CausalLM` without a preprocessor (token ids in, nothing downloaded, no
tokenizer). Its weights are the runner's: the same seeded GPT-2 parameters as model=gpt2 (`Decoder`: names and
layout of GPT-2's checkpoint, so `model.weights=` takes a GPT-2 checkpoint, a file or a Hugging Face folder, read
strictly by `Decoder.read_weights` as model=gpt2 reads it), written into the Keras variables by
`keras_weights` (c_attn's (d, 3 d) kernel split into query, key and value kernels of (d, heads, head size), c_proj's
kernel as (heads, head size, d), ...), matched by the variables' paths.

Checked as model=gpt2 is: the Keras model's logits without a cache against the runner's float64 NumPy
`Decoder.forward` on the same weights, and the tokens against that reference's greedy choice wherever it is decided.
Keras keeps float64 only on TensorFlow (on torch and JAX `keras.backend.result_type` turns float64 into float32,
runner.models.keras_model): the yaml refuses float64 there.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from runner.models.decoder import Decoder
from runner.models.keras_hub_causal_lm import KerasHubCausalLM

# {Keras sublayer variable of transformer_layer_i: GPT-2 parameter of h.i} where the layout is the same
SAME_LAYOUT = {
    "self_attention/attention_output/bias": "attn.c_proj.bias",
    "self_attention_layer_norm/gamma": "ln_1.weight",
    "self_attention_layer_norm/beta": "ln_1.bias",
    "feedforward_intermediate_dense/kernel": "mlp.c_fc.weight",
    "feedforward_intermediate_dense/bias": "mlp.c_fc.bias",
    "feedforward_output_dense/kernel": "mlp.c_proj.weight",
    "feedforward_output_dense/bias": "mlp.c_proj.bias",
    "feedforward_layer_norm/gamma": "ln_2.weight",
    "feedforward_layer_norm/beta": "ln_2.bias",
}


class KerasHubGPT2(KerasHubCausalLM, Decoder):
    """model=gpt2's spec, seeded weights, prompt and size checks; keras_hub's GPT2CausalLM computes."""

    name = "gpt2_keras_hub"
    lm_class = "GPT2CausalLM"

    def __init__(
        self,
        backend_module: str,
        layers: int = 2,
        d_model: int = 64,
        heads: int = 4,
        vocab_size: int = 512,
        context: int = 128,
        prompt_len: int = 16,
        dtype: str = "float32",
    ):
        super().__init__(layers, d_model, heads, vocab_size, context, prompt_len)
        self._keras_hub_setup(backend_module, dtype)

    # -- the mapping: GPT-2's names and layout -> keras_hub's variables ------------------------------

    def keras_weights(self, params: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """{keras_hub variable path: value} from GPT-2's parameters (numpy)."""
        weights = {
            "token_embedding/embeddings": params["wte.weight"],  # also the head: keras_hub ties it, as GPT-2 does
            "position_embedding/embeddings": params["wpe.weight"],
            "layer_norm/gamma": params["ln_f.weight"],
            "layer_norm/beta": params["ln_f.bias"],
        }
        for i in range(self.layers):
            weights.update(self._layer_weights(params, i))
        return weights

    def _layer_weights(self, params: dict[str, np.ndarray], i: int) -> dict[str, np.ndarray]:
        d, heads = self.d_model, self.heads
        size = d // heads
        gpt2, keras = f"h.{i}.", f"transformer_layer_{i}/"
        kernel, bias = params[gpt2 + "attn.c_attn.weight"], params[gpt2 + "attn.c_attn.bias"]
        weights: dict[str, np.ndarray] = {}
        for j, part in enumerate(("query", "key", "value")):  # c_attn's output columns: queries | keys | values
            weights[f"{keras}self_attention/{part}/kernel"] = kernel[:, j * d : (j + 1) * d].reshape(d, heads, size)
            weights[f"{keras}self_attention/{part}/bias"] = bias[j * d : (j + 1) * d].reshape(heads, size)
        projection = params[gpt2 + "attn.c_proj.weight"]  # its input rows: the heads merged, head by head
        weights[f"{keras}self_attention/attention_output/kernel"] = projection.reshape(heads, size, d)
        weights.update({keras + name: params[gpt2 + own] for name, own in SAME_LAYOUT.items()})
        return weights

    def _causal_lm(self, keras_hub: Any) -> Any:
        backbone = keras_hub.models.GPT2Backbone(
            vocabulary_size=self.vocab_size,
            num_layers=self.layers,
            num_heads=self.heads,
            hidden_dim=self.d_model,
            intermediate_dim=4 * self.d_model,
            dropout=0.0,
            max_sequence_length=self.context,
            dtype=self.dtype,
        )
        return keras_hub.models.GPT2CausalLM(backbone=backbone, preprocessor=None, dtype=self.dtype)

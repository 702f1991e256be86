"""keras_hub's GPT-2 (`model=gpt2_keras_hub`): the same model as `model=gpt2`, a second implementation of it, for
task=generate and task=inference on Keras 3's TensorFlow, torch and JAX backends.

The network is keras_hub's own: `keras_hub.models.GPT2Backbone` at the config's sizes (intermediate size 4 d_model,
no dropout) under `keras_hub.models.GPT2CausalLM` without a preprocessor (token ids in, nothing downloaded, no
tokenizer). Its weights are the runner's: the same seeded GPT-2 parameters as model=gpt2 (`Decoder`: names and
layout of GPT-2's checkpoint, so `model.weights=` takes a GPT-2 checkpoint, a file or a Hugging Face folder, read
strictly by `Decoder.read_weights` as model=gpt2 reads it), written into the Keras variables by
`keras_weights` (c_attn's (d, 3 d) kernel split into query, key and value kernels of (d, heads, head size), c_proj's
kernel as (heads, head size, d), ...), matched by the variables' paths.

task=generate runs keras_hub's own `GPT2CausalLM.generate()` with its greedy sampler: the prompt padded to the whole
length, `stop_token_ids=None` (it never stops early), one call timed whole. What keras_hub compiles for it differs by
backend (`describe` says which: `GENERATE_COMPILED`): on JAX one `jax.jit` of its whole generate step (the prefill
and a `lax.while_loop` of decode steps), on TensorFlow one `tf.function` of it (XLA where Keras's `jit_compile="auto"`
resolves to it: with a GPU, not on a CPU-only machine), on torch nothing (a Python loop under `torch.no_grad`). Its
prefill runs over the whole padded buffer, then each new token is one decode step (the first re-reads the prompt's
last position), all in keras_hub's static cache.

Checked as model=gpt2 is: `forward` is the Keras model over the whole sequence without a cache, compared with the
runner's float64 NumPy `Decoder.forward` on the same weights (the task's reference), and the tokens with that
reference's greedy choice wherever it is decided. Keras keeps float64 only on TensorFlow (on torch and JAX
`keras.backend.result_type` turns float64 into float32, runner.models.keras_model): the yaml refuses float64 there.

Keras is imported only inside methods, on the run's backend (its `KERAS_BACKEND`, keras_apps.import_keras): the
combination rules import this class before any framework.
"""

from __future__ import annotations

import importlib
from typing import Any

import numpy as np

from runner.models.decoder import Decoder
from runner.models.keras_apps import import_keras

# How keras_hub's CausalLM.make_generate_function runs generate_step on each Keras backend (keras_hub 0.32)
GENERATE_COMPILED = {
    "jax": "jax.jit of keras_hub's whole generate step: the prefill and a lax.while_loop of the decode steps",
    "tensorflow": "tf.function of keras_hub's whole generate step (prefill and tf.while_loop of the decode steps)",
    "torch": "nothing compiled: keras_hub's generate step eagerly under torch.no_grad, a Python loop of decode steps",
}
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


class KerasHubGPT2(Decoder):
    """model=gpt2's spec, seeded weights, prompt and size checks; keras_hub's GPT2CausalLM computes."""

    name = "gpt2_keras_hub"
    own_layout = True  # GPT-2's layout, mapped onto the Keras variables here (keras_weights)
    own_precision = True  # no mixed policy (the yaml's supports.precisions); matmul settings are process-wide

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
        self.backend_module, self.dtype = backend_module, str(dtype)
        self._keras: Any = None
        self._lm: Any = None  # the GPT2CausalLM, built on the first call
        self._device = ""  # keras.device's name for where the run's arrays are
        self._loaded: tuple = ()  # the parameters (the very arrays) the Keras variables hold
        self._padded: tuple = ()  # (prompt, new_tokens, generate()'s inputs) of the last generation

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

    # -- keras_hub's model on the run's backend ---------------------------------------------------------

    def _model(self, backend: Any, params: dict, array: Any) -> Any:
        """The GPT2CausalLM (built on the first call, on the device `array` is on) holding `params`."""
        if self._lm is None:
            self._lm = self._build(array)
        values = tuple(params.values())
        if len(values) != len(self._loaded) or any(a is not b for a, b in zip(values, self._loaded, strict=True)):
            self._assign({name: backend.to_numpy(value) for name, value in params.items()})
            self._loaded = values
        return self._lm

    def _build(self, array: Any) -> Any:
        self._keras = keras = import_keras(importlib.import_module(self.backend_module).KERAS_BACKEND)
        import keras_hub

        self._device = _keras_device(keras, array)
        with keras.device(self._device):
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
            lm = keras_hub.models.GPT2CausalLM(backbone=backbone, preprocessor=None, dtype=self.dtype)
        lm.trainable = False  # inference only: no autograd graph on torch
        lm.compile(sampler="greedy")  # Keras's defaults otherwise (jit_compile="auto")
        return lm

    def _assign(self, params: dict[str, np.ndarray]) -> None:
        variables = {v.path: v for v in self._lm.weights}
        weights = self.keras_weights(params)
        if set(weights) != set(variables):
            missing, unknown = sorted(set(variables) - set(weights)), sorted(set(weights) - set(variables))
            raise RuntimeError(
                f"keras_hub's GPT2CausalLM has variables this mapping does not set ({', '.join(missing[:5]) or '-'}) "
                f"or lacks ones it sets ({', '.join(unknown[:5]) or '-'}): keras_hub's layer names changed"
            )
        with self._keras.device(self._device):
            for path, variable in variables.items():
                variable.assign(np.asarray(weights[path], self.dtype))

    # -- what the tasks call ----------------------------------------------------------------------------

    def forward(self, ops: Any, params: dict, x: Any) -> Any:
        """Logits (batch, seq, vocab) of the Keras model called on the whole sequence, without a cache (the float64
        reference is model=gpt2's NumPy forward: Decoder.reference_logits)."""
        lm = self._model(ops, params, x)
        keras = self._keras
        with keras.device(self._device):
            mask = keras.ops.ones(keras.ops.shape(x), dtype="int32")
            return lm({"token_ids": x, "padding_mask": mask}, training=False)

    def generate(self, backend: Any, params: dict, prompt: Any, new_tokens: int) -> np.ndarray:
        """keras_hub's GPT2CausalLM.generate() with the greedy sampler: the new tokens (batch, new_tokens)."""
        lm = self._model(backend, params, prompt)
        inputs = self._inputs(backend, prompt, new_tokens)
        length = int(inputs["token_ids"].shape[1])  # the prompt's and the new tokens'
        with self._keras.device(self._device):
            out = lm.generate(inputs, max_length=length, stop_token_ids=None)
        return np.asarray(out["token_ids"][:, length - new_tokens :], np.int64)

    def _inputs(self, backend: Any, prompt: Any, new_tokens: int) -> dict[str, Any]:
        """The prompt padded to prompt_len + new_tokens and its padding mask (True over the prompt: where generation
        starts), on the device; made once for a prompt. Without a preprocessor the padding sets the length
        generate() runs to (its max_length is ignored)."""
        if not self._padded or self._padded[0] is not prompt or self._padded[1] != new_tokens:
            ids = np.asarray(backend.to_numpy(prompt), np.int32)
            batch, length = ids.shape
            padded = np.zeros((batch, length + new_tokens), np.int32)
            padded[:, :length] = ids
            mask = np.broadcast_to(np.arange(length + new_tokens) < length, padded.shape)
            ops = self._keras.ops
            with self._keras.device(self._device):
                inputs = {"token_ids": ops.convert_to_tensor(padded), "padding_mask": ops.convert_to_tensor(mask)}
            self._padded = (prompt, new_tokens, inputs)
        return self._padded[2]

    # -- the record ---------------------------------------------------------------------------------------

    def describe(self, ops: Any, params: dict, inputs: dict, task: str) -> dict[str, str]:
        if self._lm is None:
            return {}
        keras = self._keras
        backend = keras.backend.backend()
        described = {"keras_hub_forward": "GPT2CausalLM called eagerly on the whole sequence, without a cache"}
        if task == "generate":
            how = GENERATE_COMPILED[backend]
            function = self._lm.generate_function
            if backend == "tensorflow":
                xla = "with XLA" if self._lm.jit_compile else "without XLA"
                how += f", {xla} (jit_compile={self._lm.jit_compile}, Keras's 'auto' on this machine)"
                if hasattr(function, "experimental_get_tracing_count"):
                    described["keras_hub_generate_traces"] = str(function.experimental_get_tracing_count())
            described["keras_hub_generate"] = how
            if self.dtype == "float64":
                described["keras_hub_sampler"] = "argmax of float32 probabilities (Sampler.compute_probabilities)"
        return described


def _keras_device(keras: Any, array: Any) -> str:
    """keras.device's name for the device `array` is on (torch 'cuda:0', TensorFlow '.../device:GPU:0', JAX's
    'cuda:0'): Keras's variables and ops go where the runner placed the inputs."""
    where = str(getattr(array, "device", "")).lower()
    if "cuda" in where or "gpu" in where:
        return "gpu:0"
    return "cpu" if keras.backend.backend() == "torch" else "cpu:0"

"""What keras_hub's causal language models share as second implementations of the runner's decoders
(model=gpt2_keras_hub: runner.models.keras_hub_gpt2; model=keras_hub_llama: runner.models.keras_hub_llama), for
task=generate and task=inference on Keras 3's TensorFlow, torch and JAX backends.

A subclass is also the runner's model (`class KerasHubGPT2(KerasHubCausalLM, Decoder)`): its spec, seeded weights,
prompt, size checks and float64 NumPy reference (CausalLM.reference_logits) are the runner's; keras_hub computes. It
says how to build keras_hub's CausalLM (`_causal_lm`, no preprocessor: token ids in, nothing downloaded) and how the
runner's parameters map onto its Keras variables (`keras_weights`, matched by the variables' paths, every one set).

task=generate runs keras_hub's own `CausalLM.generate()` with its greedy sampler: the prompt padded to the whole
length, `stop_token_ids=None` (it never stops early), one call timed whole. What keras_hub compiles for it differs by
backend (`describe` says which: GENERATE_COMPILED). Its prefill runs over the whole padded buffer, then each new token
is one decode step (the first re-reads the prompt's last position), all in keras_hub's static cache. `forward` is the
Keras model over the whole sequence without a cache, checked against the runner's float64 NumPy forward.

Keras is imported only inside methods, on the run's backend (its `KERAS_BACKEND`, keras_apps.import_keras): the
combination rules import these classes before any framework.
"""

from __future__ import annotations

import importlib
from typing import Any

import numpy as np

from runner.models.causal_lm import CausalLM
from runner.models.keras_apps import import_keras

# How keras_hub's CausalLM.make_generate_function runs generate_step on each Keras backend (keras_hub 0.32)
GENERATE_COMPILED = {
    "jax": "jax.jit of keras_hub's whole generate step: the prefill and a lax.while_loop of the decode steps",
    "tensorflow": "tf.function of keras_hub's whole generate step (prefill and tf.while_loop of the decode steps)",
    "torch": "nothing compiled: keras_hub's generate step eagerly under torch.no_grad, a Python loop of decode steps",
}


class KerasHubCausalLM(CausalLM):
    """keras_hub's CausalLM holding the runner's parameters; put before the runner's model in the bases."""

    own_layout = True  # the runner's layout, mapped onto the Keras variables here (keras_weights)
    own_precision = True  # no mixed policy (the yaml's supports.precisions); matmul settings are process-wide
    lm_class = ""  # keras_hub's class, as the record and the mapping's refusal name it

    def _keras_hub_setup(self, backend_module: str, dtype: str) -> None:
        self.backend_module, self.dtype = backend_module, str(dtype)
        self._keras: Any = None
        self._lm: Any = None  # keras_hub's CausalLM, built on the first call
        self._device = ""  # keras.device's name for where the run's arrays are
        self._loaded: tuple = ()  # the parameters (the very arrays) the Keras variables hold
        self._padded: tuple = ()  # (prompt, new_tokens, generate()'s inputs) of the last generation

    def keras_weights(self, params: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """{keras_hub variable path: value} from the runner's parameters (numpy)."""
        raise NotImplementedError

    def _causal_lm(self, keras_hub: Any) -> Any:
        """keras_hub's CausalLM of the model's sizes in `self.dtype`, without a preprocessor."""
        raise NotImplementedError

    # -- keras_hub's model on the run's backend ---------------------------------------------------------

    def _model(self, backend: Any, params: dict, array: Any) -> Any:
        """The CausalLM (built on the first call, on the device `array` is on) holding `params`."""
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
            lm = self._causal_lm(keras_hub)
        lm.trainable = False  # inference only: no autograd graph on torch
        lm.compile(sampler="greedy")  # Keras's defaults otherwise (jit_compile="auto")
        return lm

    def _assign(self, params: dict[str, np.ndarray]) -> None:
        variables = {v.path: v for v in self._lm.weights}
        weights = self.keras_weights(params)
        if set(weights) != set(variables):
            missing, unknown = sorted(set(variables) - set(weights)), sorted(set(weights) - set(variables))
            raise RuntimeError(
                f"keras_hub's {self.lm_class} has variables this mapping does not set "
                f"({', '.join(missing[:5]) or '-'}) or lacks ones it sets ({', '.join(unknown[:5]) or '-'}): "
                "keras_hub's layer names changed"
            )
        with self._keras.device(self._device):
            for path, variable in variables.items():
                variable.assign(np.asarray(weights[path], self.dtype))

    # -- what the tasks call ----------------------------------------------------------------------------

    def forward(self, ops: Any, params: dict, x: Any, pad: Any = None) -> Any:
        """Logits (batch, seq, vocab) of the Keras model called on the whole sequence, without a cache (the float64
        reference is the runner's NumPy forward: CausalLM.reference_logits); no padding (task.prompt_lengths is
        refused for it)."""
        lm = self._model(ops, params, x)
        keras = self._keras
        with keras.device(self._device):
            mask = keras.ops.ones(keras.ops.shape(x), dtype="int32")
            return lm({"token_ids": x, "padding_mask": mask}, training=False)

    def generate(self, backend: Any, params: dict, prompt: Any, new_tokens: int) -> np.ndarray:
        """keras_hub's generate() with the greedy sampler: the new tokens (batch, new_tokens)."""
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

    def describe(self, ops: Any, params: dict, inputs: dict, backward: bool) -> dict[str, str]:
        if self._lm is None:
            return {}
        backend = self._keras.backend.backend()
        described = {"keras_hub_forward": f"{self.lm_class} called eagerly on the whole sequence, without a cache"}
        function = self._lm.generate_function  # made by the first generate()
        if function is not None:
            how = GENERATE_COMPILED[backend]
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

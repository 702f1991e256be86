"""What every decoder-only language model of task=generate shares, written once against the op family `decoder`: a
seeded prompt, the length check, the whole sequence without a cache (`forward`), one generation step with the static
key/value cache (`step`) and the float64 NumPy reference. A model says what its layers are through four hooks:
`_embed`, `_at` (what every layer reads of the step's positions, made once a step), `_block` and `_logits`.

model=llama (runner.models.llama) is one; model=gpt2's `Decoder` (runner.models.decoder) has the same methods of its
own and these hooks' signatures, so it can become one by subclassing this class.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from runner.config import ConfigError, require_positive
from runner.models import ForwardSize, Workload


def check_sizes(layers: int, d_model: int, heads: int, vocab_size: int, context: int, prompt_len: int) -> None:
    """One line for sizes a decoder cannot take: not positive, heads not dividing d_model, a prompt beyond context."""
    require_positive(
        layers=layers, d_model=d_model, heads=heads, vocab_size=vocab_size, context=context, prompt_len=prompt_len
    )
    if d_model % heads:
        raise ConfigError(
            f"model.d_model={d_model} is not divisible by model.heads={heads}: each head takes d_model / heads features"
        )
    if prompt_len > context:
        raise ConfigError(f"model.prompt_len={prompt_len} is longer than the model's context ({context} tokens)")


class CausalLM(Workload):
    """A decoder-only language model: token ids in, logits out, generated greedily with a key/value cache."""

    own_layout = True  # the checkpoint's names and layout on every backend
    layers: int
    vocab_size: int
    context: int
    prompt_len: int
    spec: dict[str, tuple]  # {weight name: shape}

    def make_inputs(self, rng: np.random.Generator, batch_size: int) -> dict[str, np.ndarray]:
        """A seeded prompt: (batch, prompt_len) token ids drawn uniformly from the vocabulary."""
        return {"x": rng.integers(0, self.vocab_size, (batch_size, self.prompt_len))}

    def examples_per_call(self, batch_size: int) -> int:
        return batch_size

    def size_setting(self, batch_size: int) -> str:
        return f"model.prompt_len={self.prompt_len} batch_size={batch_size}"

    def check_length(self, length: int, setting: str) -> None:
        """Refuse a sequence (prompt and new tokens) longer than the model's positions."""
        if length > self.context:
            raise ConfigError(
                f"{setting}: {length} tokens do not fit the model's context of {self.context} positions "
                f"(model.context): lower them"
            )

    # -- written once, run on every backend's ops --------------------------------------------

    def forward(self, ops: Any, params: dict, x: Any, pad: Any = None) -> Any:
        """Logits (batch, seq, vocab) of a whole sequence of ids, without a cache; `pad` as in `step`."""
        where = ops.step_index(0, x)
        h = self._embed(ops, params, x, where, pad)
        at = self._at(ops, where, h, x.shape[1], pad)
        for i in range(self.layers):
            h, _ = self._block(ops, params, i, h, None, where, at)
        return self._logits(ops, params, h)

    def step(self, ops: Any, params: dict, cache: list, ids: Any, start: Any, pad: Any = None) -> tuple[Any, Any, list]:
        """One generation step with the cache: ids (batch, t) at positions start .. start + t - 1 (the prompt at 0,
        or one new token) -> (the last position's logits (batch, vocab), the greedy next ids (batch, 1), the cache
        with this step's keys and values written). `pad`: None, or (batch,) integers, each prompt's left padding in
        a batch of prompts of different lengths: a prompt sees none of its padding, and its positions count from its
        first token, so that it gets the tokens it gets alone."""
        where = ops.step_index(start, ids)  # the step's positions, made once for every layer
        h = self._embed(ops, params, ids, where, pad)
        at = self._at(ops, where, h, cache[0][0].shape[2], pad)
        written = []
        for i in range(self.layers):
            h, kv = self._block(ops, params, i, h, cache[i], where, at)
            written.append(kv)
        logits = self._logits(ops, params, ops.last_position(h))
        return logits, ops.greedy(logits), written

    def _embed(self, ops: Any, params: dict, ids: Any, where: Any, pad: Any = None) -> Any:
        raise NotImplementedError

    def _at(self, ops: Any, where: Any, h: Any, keys: int, pad: Any = None) -> Any:
        """What every layer reads of the step's positions, made once a step: here the attention mask of the step's
        queries over `keys` keys (the cache's length, or the sequence's own)."""
        return ops.attention_mask(where, h.shape[1], keys, pad)

    def _block(self, ops: Any, p: dict, i: int, x: Any, cache: Any, where: Any, at: Any) -> tuple[Any, Any]:
        """Layer i: (its output, its keys and values: written into `cache` where there is one)."""
        raise NotImplementedError

    def _logits(self, ops: Any, params: dict, h: Any) -> Any:
        raise NotImplementedError

    # -- the float64 reference ----------------------------------------------------------------

    def reference_logits(self, params: dict, ids: np.ndarray, pad: np.ndarray | None = None) -> np.ndarray:
        """The logits of a whole sequence in float64 NumPy, without a cache: what every run of the model is checked
        against."""
        from runner.backends import numpy_backend

        params64 = {k: np.asarray(v, np.float64) for k, v in params.items()}
        return CausalLM.forward(self, numpy_backend, params64, np.asarray(ids), pad)

    def own_reference(self, request: dict[str, Any], params: dict, inputs: dict) -> dict[str, np.ndarray] | None:
        """The outputs: the logits in float64 numpy (token ids stay integers)."""
        return {"outputs/y": self.reference_logits(params, inputs["x"])} if request["results"] == "outputs/y" else None

    # -- sizes: the memory check and the cost note (generation_elements, generation_flops: the model's own) ---------

    def forward_size(self, batch_size: int) -> ForwardSize:
        """The prompt's logits and one layer's activations, as a generation of no new tokens."""
        e = self.generation_elements(batch_size, self.prompt_len, 0)
        return ForwardSize(
            e["weights"], e["inputs"], e["results"], batch_size, self.prompt_len,
            self.generation_flops(batch_size, self.prompt_len, 0), e["activations"],
        )  # fmt: skip

    def generation_elements(self, batch_size: int, length: int, new_tokens: int) -> dict[str, int]:
        raise NotImplementedError

    def cache_shape(self, batch_size: int, length: int) -> tuple[int, int, int, int]:
        raise NotImplementedError

    def row_tables(self) -> tuple[str, ...]:
        """The weights a step reads only a row of per token (embedding tables that are not also the head)."""
        return ()

    def decode_bytes(self, batch_size: int, length: int, itemsize: int) -> dict[str, int]:
        """Bytes one decode step reads (a token for each prompt of the batch): "weights", every weight once (the row
        tables' rows of the batch's tokens alone), and "kv_cache", every layer's keys and values over the whole
        static cache of `length` positions, which attention reads masked. Activations and logits are left out."""
        rows = self.row_tables()
        weights = sum(
            batch_size * shape[-1] if name in rows else int(np.prod(shape)) for name, shape in self.spec.items()
        )
        cache = self.layers * 2 * int(np.prod(self.cache_shape(batch_size, length)))
        return {"weights": weights * itemsize, "kv_cache": cache * itemsize}

    def generation_flops(self, batch_size: int, prompt_len: int, new_tokens: int) -> float:
        raise NotImplementedError

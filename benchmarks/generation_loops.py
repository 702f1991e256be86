#!/usr/bin/env python
"""The hand-written side of parity.py's generation rows: GPT-2 greedy generation with a static key/value cache,
written by hand the way each framework's users write it, with the runner's seeded weights and prompt (the model code
here is not the runner's: only `Decoder.init_params` and `make_inputs` are reused, so both sides do the same work).

Each generation is the prompt's step (prefill), which makes the first new token, then NEW_TOKENS - 1 decode steps,
each taking the token before it; every new token is brought to the host as it is made (streamed), as the runner's
`task=generate` does. The cache holds prompt + new tokens positions, attention runs over the whole buffer with the
positions not yet written masked.

torch (eager): a nanoGPT-style forward (`F.linear` on (out, in) weights, as nanoGPT loads GPT-2's Conv1D ones),
    the cache preallocated and written in place with `index_copy_` (HF's StaticCache), `F.scaled_dot_product_attention`
    with a boolean mask over the whole cache, under `inference_mode`; the token to the host by `.cpu().numpy()`.
JAX: `jax.jit` prefill and `jax.jit` decode step, the cache donated to both and written by `dynamic_update_slice`,
    the position carried on the device from step to step; the token to the host by `np.asarray` (`jax.device_get`
    of the just-made token cost 0.37 ms more a step on the loaded 2-core VM: 1.10 against 0.73 ms).
    Beside it (not a parity row: it streams nothing): the whole decode in one jitted `lax.fori_loop`, the tokens
    brought to the host at the end. `python benchmarks/generation_loops.py --threads 1` times it against the
    per-step loop in parity.py's alternating blocks.
TensorFlow: one `tf.function` step over a `tf.Module`'s state: weights, the caches (fixed shape) and the position in
    `tf.Variable`s, the step's keys and values assigned into a slice of the cache; the token to the host by `.numpy()`.

Before anything is timed each loop's logits are checked against float64 NumPy without a cache, and parity.py checks
that the loop's tokens are the runner's. (Seeded, untrained GPT-2 with its head tied to the token embedding repeats
one token; the logits check is what tells a wrong cache or mask.)
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np

SIZES = {"layers": 2, "d_model": 128, "heads": 4, "vocab_size": 2048, "prompt_len": 16}
NEW_TOKENS, BATCH, SEED, EPS = 16, 1, 0, 1e-5
OVERRIDES = (
    "model=gpt2",
    *(f"model.{k}={v}" for k, v in SIZES.items()),
    "task=generate",
    f"task.new_tokens={NEW_TOKENS}",
    f"batch_size={BATCH}",
)
EAGER, COMPILED = "gpt2_generate_eager", "gpt2_generate_compiled"
ROWS = (EAGER, COMPILED)
LOGITS_TOLERANCE = 1e-4  # float32 against float64: seen 2e-7 (torch, CPU)
Loops = dict[str, list[tuple[str, Callable[[], object]]]]


def describe() -> str:
    return ", ".join(f"{k} {v}" for k, v in SIZES.items()) + f", {NEW_TOKENS} new tokens, batch {BATCH}"


def seeded() -> tuple[object, dict, np.ndarray]:
    """The workload, its float64 weights and the prompt, drawn as the runner draws them for seed 0."""
    from runner.models.decoder import Decoder

    model = Decoder(**SIZES)
    rng = np.random.default_rng(SEED)
    params = model.init_params(rng)
    return model, params, model.make_inputs(rng, BATCH)["x"]


def check(name: str, tokens: np.ndarray, logits: list[np.ndarray]) -> None:
    """A loop's tokens (batch, new) and every step's logits against float64 NumPy over the same sequence without a
    cache; the tokens where the reference's top two logits are further apart than twice the error."""
    from runner.backends import numpy_backend

    model, params, prompt = seeded()
    sequence = np.concatenate([prompt, tokens[:, :-1]], axis=1)
    reference = model.forward(numpy_backend, params, sequence)[:, prompt.shape[1] - 1 :]
    got = np.stack(logits, axis=1).astype(np.float64)
    error = float(np.max(np.abs(got - reference)))
    if tokens.shape != (BATCH, NEW_TOKENS) or error > LOGITS_TOLERANCE:
        raise AssertionError(f"{name}: tokens {tokens.shape}, logits off float64 by {error:.2e}")
    top_two = np.sort(reference, axis=-1)[..., -2:]
    decided = top_two[..., 1] - top_two[..., 0] > 2 * error
    if np.any(decided & (tokens != reference.argmax(-1))):
        raise AssertionError(f"{name}: greedy tokens differ from float64's where its choice is decided")


def checked(name: str, generate: Callable[..., np.ndarray]) -> Callable[..., np.ndarray]:
    """`generate` once checked (`check`); where the check fails, a call that raises its error: parity.py then
    reports that row as failed and measures the others."""
    kept: list = []
    try:
        check(name, generate(kept), kept)
    except AssertionError as error:
        failed = error

        def failing(keep: list | None = None) -> np.ndarray:
            raise failed

        return failing
    return generate


def same_tokens(runner: np.ndarray, hand: np.ndarray, row: str) -> None:
    """parity.py, before timing a generation row: both sides generated the same tokens."""
    if not np.array_equal(np.asarray(runner), np.asarray(hand)):
        raise AssertionError(
            f"{row}: the hand-written loop's tokens {np.asarray(hand).tolist()} are not the runner's "
            f"{np.asarray(runner).tolist()}"
        )


# -- torch ----------------------------------------------------------------------------------------------------


def torch_generation_loops(device: str) -> Loops:
    import torch
    import torch.nn.functional as F

    model, params64, prompt = seeded()
    d, heads, length = model.d_model, model.heads, model.prompt_len + NEW_TOKENS
    size = d // heads
    w = {}
    for k, v in params64.items():
        array = v.T if k.endswith(("c_attn.weight", "c_proj.weight", "c_fc.weight")) else v  # nn.Linear's (out, in)
        w[k] = torch.from_numpy(np.ascontiguousarray(array, np.float32)).to(device)
    caches = [torch.zeros(2, BATCH, heads, length, size, device=device) for _ in range(model.layers)]
    ids = torch.from_numpy(prompt).to(device)
    slots = torch.arange(length, device=device)

    def forward(ids: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        """Logits (batch, vocab) of the last of `ids` (batch, t) at positions `pos` (t,); the cache written."""
        batch, t = ids.shape
        x = F.embedding(ids, w["wte.weight"]) + F.embedding(pos, w["wpe.weight"])
        mask = slots[None, :] <= pos[:, None]  # (t, length): each query sees the positions up to its own
        for i, cache in enumerate(caches):
            p = f"h.{i}."
            h = F.layer_norm(x, (d,), w[p + "ln_1.weight"], w[p + "ln_1.bias"], EPS)
            q, k, v = F.linear(h, w[p + "attn.c_attn.weight"], w[p + "attn.c_attn.bias"]).split(d, dim=2)
            q, k, v = (a.view(batch, t, heads, size).transpose(1, 2) for a in (q, k, v))
            cache[0].index_copy_(2, pos, k)
            cache[1].index_copy_(2, pos, v)
            y = F.scaled_dot_product_attention(q, cache[0], cache[1], attn_mask=mask)
            x = x + F.linear(
                y.transpose(1, 2).reshape(batch, t, d), w[p + "attn.c_proj.weight"], w[p + "attn.c_proj.bias"]
            )
            h = F.layer_norm(x, (d,), w[p + "ln_2.weight"], w[p + "ln_2.bias"], EPS)
            h = F.gelu(F.linear(h, w[p + "mlp.c_fc.weight"], w[p + "mlp.c_fc.bias"]), approximate="tanh")
            x = x + F.linear(h, w[p + "mlp.c_proj.weight"], w[p + "mlp.c_proj.bias"])
        return F.linear(F.layer_norm(x[:, -1], (d,), w["ln_f.weight"], w["ln_f.bias"], EPS), w["wte.weight"])

    @torch.inference_mode()
    def generate(keep: list | None = None) -> np.ndarray:
        pos = slots[: ids.shape[1]]
        logits = forward(ids, pos)
        token = logits.argmax(-1, keepdim=True)
        tokens = [token.cpu().numpy()]  # streamed: on the host as soon as it is made
        for _ in range(NEW_TOKENS - 1):
            if keep is not None:
                keep.append(logits.cpu().numpy())
            pos = pos[-1:] + 1
            logits = forward(token, pos)
            token = logits.argmax(-1, keepdim=True)
            tokens.append(token.cpu().numpy())
        if keep is not None:
            keep.append(logits.cpu().numpy())
        return np.concatenate(tokens, axis=1)

    return {EAGER: [("static cache (index_copy_) + F.scaled_dot_product_attention, eager", checked("torch", generate))]}


# -- JAX ------------------------------------------------------------------------------------------------------


def _jax_model(model, length: int):
    """forward(w, cache, ids, start) -> (last logits, cache): the GPT-2 step in jax.numpy, the cache written with
    dynamic_update_slice at `start`."""
    import jax
    import jax.numpy as jnp

    d, heads = model.d_model, model.heads
    size = d // heads

    def layer_norm(x, g, b):
        mean = jnp.mean(x, -1, keepdims=True)
        return (x - mean) * jax.lax.rsqrt(jnp.var(x, -1, keepdims=True) + EPS) * g + b

    def forward(w, cache, ids, start):
        batch, t = ids.shape
        x = w["wte.weight"][ids] + jax.lax.dynamic_slice_in_dim(w["wpe.weight"], start, t)
        mask = jnp.arange(length)[None, :] <= (start + jnp.arange(t))[:, None]
        written = []
        for i, (k_cache, v_cache) in enumerate(cache):
            p = f"h.{i}."
            h = layer_norm(x, w[p + "ln_1.weight"], w[p + "ln_1.bias"])
            qkv = h @ w[p + "attn.c_attn.weight"] + w[p + "attn.c_attn.bias"]
            q, k, v = (a.reshape(batch, t, heads, size).transpose(0, 2, 1, 3) for a in jnp.split(qkv, 3, axis=-1))
            k_cache = jax.lax.dynamic_update_slice(k_cache, k, (0, 0, start, 0))
            v_cache = jax.lax.dynamic_update_slice(v_cache, v, (0, 0, start, 0))
            scores = jnp.einsum("bhqd,bhkd->bhqk", q, k_cache) / np.sqrt(size).astype(np.float32)
            y = jnp.einsum("bhqk,bhkd->bhqd", jax.nn.softmax(jnp.where(mask, scores, -jnp.inf), axis=-1), v_cache)
            x = (
                x
                + y.transpose(0, 2, 1, 3).reshape(batch, t, d) @ w[p + "attn.c_proj.weight"]
                + w[p + "attn.c_proj.bias"]
            )
            h = layer_norm(x, w[p + "ln_2.weight"], w[p + "ln_2.bias"])
            h = jax.nn.gelu(h @ w[p + "mlp.c_fc.weight"] + w[p + "mlp.c_fc.bias"], approximate=True)
            x = x + h @ w[p + "mlp.c_proj.weight"] + w[p + "mlp.c_proj.bias"]
            written.append((k_cache, v_cache))
        return layer_norm(x[:, -1], w["ln_f.weight"], w["ln_f.bias"]) @ w["wte.weight"].T, written

    return forward


def _jax_setup(device: str):
    import jax

    jax.config.update("jax_default_matmul_precision", "highest")  # as the runner sets it: no TF32 passes on GPUs
    model, params64, prompt = seeded()
    on = jax.devices("gpu" if device == "cuda" else "cpu")[0]
    length = model.prompt_len + NEW_TOKENS
    w = jax.device_put({k: v.astype(np.float32) for k, v in params64.items()}, on)
    shape = (BATCH, model.heads, length, model.d_model // model.heads)
    held = {
        "cache": [tuple(jax.device_put(np.zeros(shape, np.float32), on) for _ in range(2)) for _ in range(model.layers)]
    }
    return model, w, jax.device_put(prompt.astype(np.int32), on), length, held


def jax_per_step(device: str) -> Callable[..., np.ndarray]:
    """generate(keep=None): jitted prefill, then a jitted decode step per token, each token fetched to the host."""
    import jax
    import jax.numpy as jnp

    model, w, prompt, length, held = _jax_setup(device)
    forward = _jax_model(model, length)

    @functools.partial(jax.jit, donate_argnums=(1,))
    def prefill(w, cache, ids):
        logits, cache = forward(w, cache, ids, 0)
        return logits, jnp.argmax(logits, -1).astype(ids.dtype)[:, None], cache, jnp.int32(ids.shape[1])

    @functools.partial(jax.jit, donate_argnums=(1,))
    def decode(w, cache, token, pos):
        logits, cache = forward(w, cache, token, pos)
        return logits, jnp.argmax(logits, -1).astype(token.dtype)[:, None], cache, pos + 1

    def generate(keep: list | None = None) -> np.ndarray:
        logits, token, held["cache"], pos = prefill(w, held["cache"], prompt)
        tokens = [np.asarray(token)]  # streamed: waits for the step, copies the token to the host
        for _ in range(NEW_TOKENS - 1):
            if keep is not None:
                keep.append(jax.device_get(logits))
            logits, token, held["cache"], pos = decode(w, held["cache"], token, pos)
            tokens.append(np.asarray(token))
        if keep is not None:
            keep.append(jax.device_get(logits))
        return np.concatenate(tokens, axis=1)

    return generate


def jax_fori_loop(device: str) -> Callable[..., np.ndarray]:
    """generate(keep=None): prefill and the whole decode in one jitted function (lax.fori_loop over the new tokens);
    the tokens reach the host at the end, all at once."""
    import jax
    import jax.numpy as jnp

    model, w, prompt, length, held = _jax_setup(device)
    forward = _jax_model(model, length)
    prompt_len = model.prompt_len

    @functools.partial(jax.jit, donate_argnums=(1,))
    def whole(w, cache, ids):
        logits, cache = forward(w, cache, ids, 0)
        token = jnp.argmax(logits, -1).astype(ids.dtype)[:, None]
        tokens = jnp.zeros((ids.shape[0], NEW_TOKENS), ids.dtype).at[:, :1].set(token)
        every = jnp.zeros((ids.shape[0], NEW_TOKENS, logits.shape[-1]), logits.dtype).at[:, 0].set(logits)

        def body(i, carry):
            tokens, every, token, cache = carry
            logits, cache = forward(w, cache, token, prompt_len + i - 1)
            token = jnp.argmax(logits, -1).astype(ids.dtype)[:, None]
            tokens = jax.lax.dynamic_update_slice(tokens, token, (0, i))
            return tokens, jax.lax.dynamic_update_slice(every, logits[:, None], (0, i, 0)), token, cache

        tokens, every, _, cache = jax.lax.fori_loop(1, NEW_TOKENS, body, (tokens, every, token, cache))
        return tokens, every, cache

    def generate(keep: list | None = None) -> np.ndarray:
        tokens, every, held["cache"] = whole(w, held["cache"], prompt)
        if keep is not None:
            keep.extend(np.moveaxis(jax.device_get(every), 1, 0))
        return jax.device_get(tokens)

    return generate


def jax_generation_loops(device: str) -> Loops:
    generate = checked("jax per step", jax_per_step(device))
    return {COMPILED: [("jax.jit prefill + jax.jit decode step (cache donated), token fetched each step", generate)]}


# -- TensorFlow -----------------------------------------------------------------------------------------------


def tensorflow_generation_loops(device: str) -> Loops:
    import tensorflow as tf

    model, params64, prompt = seeded()
    d, heads, length = model.d_model, model.heads, model.prompt_len + NEW_TOKENS
    size = d // heads

    class GPT2(tf.Module):
        def __init__(self):
            super().__init__()
            self.w = {k: tf.Variable(v.astype(np.float32), name=k.replace(".", "_")) for k, v in params64.items()}
            shape = (BATCH, heads, length, size)
            self.cache = [
                [tf.Variable(tf.zeros(shape), trainable=False) for _ in range(2)] for _ in range(model.layers)
            ]
            self.position = tf.Variable(0, trainable=False)

        @staticmethod
        def layer_norm(x, g, b):
            mean, var = tf.nn.moments(x, axes=[-1], keepdims=True)
            return (x - mean) * tf.math.rsqrt(var + EPS) * g + b

        @tf.function
        def step(self, ids):
            """(logits (batch, vocab), next ids (batch, 1)) of `ids` (batch, t) at the held position; the cache
            written and the position moved on."""
            w, t = self.w, ids.shape[1]
            start = self.position.read_value()
            pos = start + tf.range(t)
            x = tf.gather(w["wte.weight"], ids) + tf.gather(w["wpe.weight"], pos)
            mask = tf.range(length)[None, :] <= pos[:, None]
            for i, (k_cache, v_cache) in enumerate(self.cache):
                p = f"h.{i}."
                h = self.layer_norm(x, w[p + "ln_1.weight"], w[p + "ln_1.bias"])
                qkv = tf.matmul(h, w[p + "attn.c_attn.weight"]) + w[p + "attn.c_attn.bias"]
                q, k, v = (
                    tf.transpose(tf.reshape(a, (-1, t, heads, size)), (0, 2, 1, 3)) for a in tf.split(qkv, 3, -1)
                )
                k_cache[:, :, start : start + t].assign(k)
                v_cache[:, :, start : start + t].assign(v)
                scores = tf.matmul(q, k_cache, transpose_b=True) / np.sqrt(size).astype(np.float32)
                y = tf.matmul(tf.nn.softmax(tf.where(mask, scores, -np.inf), axis=-1), v_cache)
                y = tf.reshape(tf.transpose(y, (0, 2, 1, 3)), (-1, t, d))
                x = x + tf.matmul(y, w[p + "attn.c_proj.weight"]) + w[p + "attn.c_proj.bias"]
                h = self.layer_norm(x, w[p + "ln_2.weight"], w[p + "ln_2.bias"])
                h = tf.nn.gelu(tf.matmul(h, w[p + "mlp.c_fc.weight"]) + w[p + "mlp.c_fc.bias"], approximate=True)
                x = x + tf.matmul(h, w[p + "mlp.c_proj.weight"]) + w[p + "mlp.c_proj.bias"]
            self.position.assign_add(t)
            last = self.layer_norm(x[:, -1], w["ln_f.weight"], w["ln_f.bias"])
            logits = tf.matmul(last, w["wte.weight"], transpose_b=True)
            return logits, tf.argmax(logits, -1, output_type=ids.dtype)[:, None]

    gpt2 = GPT2()
    ids = tf.constant(prompt.astype(np.int32))

    def generate(keep: list | None = None) -> np.ndarray:
        gpt2.position.assign(0)
        logits, token = gpt2.step(ids)
        tokens = [token.numpy()]  # streamed: on the host as soon as it is made
        for _ in range(NEW_TOKENS - 1):
            if keep is not None:
                keep.append(logits.numpy())
            logits, token = gpt2.step(token)
            tokens.append(token.numpy())
        if keep is not None:
            keep.append(logits.numpy())
        return np.concatenate(tokens, axis=1)

    generate = checked("tensorflow", generate)
    return {COMPILED: [("tf.function step over tf.Variable caches (fixed shape), token fetched each step", generate)]}


# -- JAX: per-step jit against the whole decode in one fori_loop --------------------------------------------------


def main(argv: list[str]) -> int:
    """Per-step jit / whole-loop fori_loop, in parity.py's alternating paired blocks; prints one line."""
    parser = argparse.ArgumentParser(description="JAX generation: per-step jit against one jitted lax.fori_loop")
    parser.add_argument("--threads", type=int, default=0, help="XLA's CPU threads (its affinity); 0: all")
    parser.add_argument("--budget", type=float, default=3.0, help="seconds of paired blocks")
    args = parser.parse_args(argv)
    root = Path(__file__).resolve().parents[1]
    sys.path[:0] = [str(root / "src"), str(root / "benchmarks")]
    import parity

    from runner.backends import jax_backend
    from runner.measure.malloc import keep_freed_memory

    if args.threads:
        jax_backend.set_threads(args.threads)
    keep_freed_memory()
    per_step, whole = jax_per_step("cpu"), jax_fori_loop("cpu")
    for name, generate in (("per step", per_step), ("fori_loop", whole)):
        kept: list = []
        check(f"jax {name}", generate(kept), kept)
    same_tokens(per_step(), whole(), "jax per step vs fori_loop")
    a, b = parity.paired_blocks(per_step, whole, lambda: None, args.budget)
    ratios = sorted(x / y for x, y in zip(a, b, strict=True))
    q25, q75 = np.percentile(ratios, [25, 75])
    print(
        f"jax generation ({describe()}, {os.cpu_count()} cores, threads {args.threads or 'all'}): per-step jit "
        f"{statistics.median(a) * 1e3:.2f} ms, fori_loop {statistics.median(b) * 1e3:.2f} ms; per step / fori_loop = "
        f"{statistics.median(ratios):.3f} ({q25:.3f}-{q75:.3f}, {len(ratios)} pairs)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""The other side of parity.py's Llama generation row: transformers' own `LlamaForCausalLM.generate()` with its static
cache (`cache_implementation="static"`), greedy, on the runner's seeded weights and prompt (loaded into HF's model under
its state dict's names: the runner's Llama carries them without `model.`), in float32 on torch eager.

Both sides do the same work: the prompt's prefill, then NEW_TOKENS - 1 decode steps over a cache of prompt + new tokens
positions, batch 1; parity.py asserts their tokens equal before timing. HF's generate() also runs its logits
processors and stopping criteria each step and returns the tokens at the end; the runner brings each token to the host
as it is made (streamed).
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import numpy as np

SIZES = {"layers": 4, "d_model": 256, "heads": 8, "kv_heads": 2, "ffn": 704, "vocab_size": 8192, "prompt_len": 16}
NEW_TOKENS, BATCH, SEED = 16, 1, 0
OVERRIDES = (
    "model=llama",
    *(f"model.{k}={v}" for k, v in SIZES.items()),
    "task=generate",
    f"task.new_tokens={NEW_TOKENS}",
    f"batch_size={BATCH}",
)
ROW = "llama_generate_eager_vs_hf"
IDIOM = 'transformers LlamaForCausalLM.generate(cache_implementation="static"), greedy'


def describe() -> str:
    return ", ".join(f"{k} {v}" for k, v in SIZES.items()) + f", {NEW_TOKENS} new tokens, batch {BATCH}"


@functools.cache
def _generate(device: str) -> Callable[[], np.ndarray]:
    """HF's model on the runner's seed-0 weights and prompt, and a call of its generate() giving the new tokens."""
    import torch
    import transformers

    from runner.models.llama import Llama

    model = Llama(**SIZES)
    rng = np.random.default_rng(SEED)  # drawn as the runner draws them: the weights, then the prompt
    params = model.init_params(rng)
    prompt = torch.from_numpy(model.make_inputs(rng, BATCH)["x"]).to(device)
    config = transformers.LlamaConfig(
        vocab_size=model.vocab_size, hidden_size=model.d_model, intermediate_size=model.ffn,
        num_hidden_layers=model.layers, num_attention_heads=model.heads, num_key_value_heads=model.kv_heads,
        max_position_embeddings=model.context, rms_norm_eps=model.rms_eps, rope_theta=model.rope_theta,
        tie_word_embeddings=model.tie_embeddings, bos_token_id=None, eos_token_id=None, pad_token_id=0,
    )  # fmt: skip
    hf = transformers.LlamaForCausalLM(config).eval()
    state = {("" if k == "lm_head.weight" else "model.") + k: torch.from_numpy(v.astype(np.float32)) for k, v in
             params.items()}  # fmt: skip
    hf.load_state_dict(state, strict=True)
    hf = hf.to(device)
    mask = torch.ones_like(prompt)

    @torch.inference_mode()
    def generate() -> np.ndarray:
        out = hf.generate(prompt, attention_mask=mask, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS,
                          do_sample=False, cache_implementation="static")  # fmt: skip
        return out[:, prompt.shape[1] :].cpu().numpy()

    return generate


def torch_hf_loops(device: str) -> dict[str, list[tuple[str, Callable[[], np.ndarray]]]]:
    """The row for parity.py's torch worker; transformers is imported and the model built at its first call."""
    return {ROW: [(IDIOM, lambda: _generate(device)())]}

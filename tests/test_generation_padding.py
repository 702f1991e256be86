"""task.prompt_lengths: a batch of prompts of different lengths, left-padded with the padding masked and each prompt's
positions its own, gives each prompt the tokens (and logits) it gets alone, on every backend; the run's check
against float64 NumPy masks the padding too; settings it cannot take are refused in one line."""

from __future__ import annotations

from pathlib import Path

import h5py
import numpy as np
import pytest

from runner.backends import load_backend
from runner.config import compose
from runner.measure.job import run_and_record
from runner.models import backend_for
from runner.models.causal_lm import CausalLM
from runner.models.decoder import Decoder
from runner.models.llama import Llama
from runner.record.naming import job_spec
from runner.tasks import Setup
from runner.tasks.generate import Generate, Generation

LENGTHS = [16, 1, 9, 4, 13, 7, 2, 11]  # 8 prompts, left-padded to 16
WIDTH, NEW = 16, 6
TOLERANCE = {"float32": 1e-4, "float64": 1e-10}  # batch against alone: the same arithmetic on other shapes
FAST = ["timing.warmup_s=0", "timing.min_warmup_calls=1", "timing.min_repeats=2", "timing.max_time_s=0.05"]
FAST += ["timing.rounds=1", "tracking=none"]


def models() -> dict[str, CausalLM]:
    """GPT-2's learned positions and Llama's rotary ones (with grouped-query heads)."""
    return {"gpt2": Decoder(prompt_len=WIDTH), "llama": Llama(prompt_len=WIDTH)}


def generate(backend: str, mode: str, dtype: str, model: CausalLM, params: dict, prompt: np.ndarray, pad=None):
    """(tokens, every step's logits) of one generation on the backend, in this process."""
    b = backend_for(model, load_backend(f"runner.backends.{backend}_backend"))
    device = b.prepare("cpu", dtype)
    held = {k: b.asarray(v, device, dtype) for k, v in params.items()}
    setup = Setup(b, model, mode, device, held, {"x": b.token_ids(prompt, device)}, {}, False, "full", dtype)
    generation = Generation(setup, NEW, pad=pad)
    return generation(), np.stack(generation.first_logits, axis=1)


def _case(backend: str, mode: str, dtype: str, heavy: bool = False):
    return pytest.param(backend, mode, dtype, marks=[pytest.mark.heavy] * heavy, id=f"{backend}-{mode}-{dtype}")


# Default: numpy and torch eager; heavy: the compiled steps (each prompt alone is a shape of its own to compile)
CASES = [
    _case("numpy", "eager", "float64"),
    _case("torch", "eager", "float32"),
    _case("torch", "function", "float32", heavy=True),
    _case("jax", "function", "float32", heavy=True),
    _case("tensorflow", "function", "float64", heavy=True),
    _case("tnp", "function", "float32", heavy=True),
]


@pytest.mark.parametrize("name", ["gpt2", "llama"])
@pytest.mark.parametrize(("backend", "mode", "dtype"), CASES)
def test_each_prompt_of_a_padded_batch_gets_the_tokens_it_gets_alone(backend, mode, dtype, name):
    model = models()[name]
    rng = np.random.default_rng(3)
    params = model.init_params(rng)
    prompt = rng.integers(0, model.vocab_size, (len(LENGTHS), WIDTH))
    pad = Generate("generate", NEW, LENGTHS).padding(*prompt.shape)
    tokens, logits = generate(backend, mode, dtype, model, params, prompt, pad)
    for row, length in enumerate(LENGTHS):
        alone, alone_logits = generate(backend, mode, dtype, model, params, prompt[row : row + 1, WIDTH - length :])
        np.testing.assert_array_equal(tokens[row], alone[0], err_msg=f"prompt {row}, {length} tokens")
        np.testing.assert_allclose(logits[row], alone_logits[0], rtol=0, atol=TOLERANCE[dtype])


def test_the_padding_is_each_prompts_width_left_over_row_by_row():
    task = Generate("generate", NEW, [3, 5])
    np.testing.assert_array_equal(task.padding(5, 8), [5, 3, 5, 3, 5])  # the lengths taken in turn
    assert Generate("generate", NEW).padding(5, 8) is None  # every prompt fills the width: no mask at all


def test_the_padding_changes_what_a_prompt_gets():
    """Unmasked, the shorter prompts would read their padding: the mask is what makes the batch agree."""
    model = models()["llama"]
    rng = np.random.default_rng(3)
    params = model.init_params(rng)
    prompt = rng.integers(0, model.vocab_size, (2, WIDTH))
    masked = model.reference_logits(params, prompt, np.array([0, WIDTH - 4]))
    unmasked = model.reference_logits(params, prompt)
    np.testing.assert_allclose(masked[0], unmasked[0], rtol=1e-12)  # no padding: nothing changes
    assert np.abs(masked[1, -1] - unmasked[1, -1]).max() > 1e-3
    alone = model.reference_logits(params, prompt[1:, WIDTH - 4 :])
    np.testing.assert_allclose(masked[1, -4:], alone[0], rtol=0, atol=1e-12)


@pytest.mark.parametrize(("model", "backend"), [("llama", "numpy"), ("llama", "torch"), ("gpt2", "torch")])
def test_a_padded_run_is_checked_against_float64_with_the_padding_masked(tmp_path: Path, model, backend):
    lengths = "[" + ",".join(map(str, LENGTHS)) + "]"
    cfg = compose([*FAST, f"model={model}", "task=generate", f"task.new_tokens={NEW}", f"model.prompt_len={WIDTH}",
                   f"task.prompt_lengths={lengths}", "batch_size=8", f"backend={backend}"])  # fmt: skip
    outcome = run_and_record(job_spec(cfg), tmp_path)
    assert outcome.status == "FINISHED", outcome.error
    m = outcome.metrics
    assert m["within_reference_tolerance"] == 1.0, m["max_rel_err_vs_reference"]
    assert m["tokens_differ"] == 0 and m["tokens_decided"] > 0
    assert m["cache_vs_recompute_max_rel_err"] <= 1e-5
    with h5py.File(tmp_path / "tensors.h5") as f:
        assert f["outputs/tokens"].shape == (8, NEW)


def test_prompt_lengths_beyond_the_width_are_refused_in_one_line(tmp_path: Path):
    cfg = compose([*FAST, "model=llama", "task=generate", "model.prompt_len=8", "task.prompt_lengths=[4,9]"])
    outcome = run_and_record(job_spec(cfg), tmp_path)
    assert outcome.status == "FAILED"
    assert outcome.error == (
        "task.prompt_lengths=[4, 9]: each must be 1 .. model.prompt_len=8, the width the batch is left-padded to"
    )


def test_a_model_generating_through_its_own_api_takes_no_prompt_lengths(tmp_path: Path):
    cfg = compose([*FAST, "model=gpt2_keras_hub", "task=generate", "task.prompt_lengths=[3]", "backend=jax"])
    outcome = run_and_record(job_spec(cfg), tmp_path)  # refused before the framework is imported
    assert outcome.status == "FAILED"
    assert outcome.error == (
        "task.prompt_lengths=[3]: model=gpt2_keras_hub generates through its own API, which pads no prompts"
    )

"""Half precision on tf.experimental.numpy computes in half precision: its error against float64 is TensorFlow's on
the same weights (within a factor of 2), for every model tnp runs, not a float32 run's tenfold smaller one."""

from __future__ import annotations

import pytest
from helpers import FAST_TIMING

from runner.measure.job import run_and_record
from runner.record.naming import job_spec

GPT2_TINY = ["model.layers=2", "model.d_model=32", "model.heads=2", "model.vocab_size=64", "model.prompt_len=5"]
MODELS = {
    "mlp": ["model=mlp", "task=inference"],
    "matmul": ["model=matmul", "task=inference"],
    "sigmoid": ["model=sigmoid", "task=inference"],
    "transformer": ["model=transformer", "task=inference"],
    "transformer_train_step": ["model=transformer", "task=train_step"],
    "gpt2_generate": ["model=gpt2", "task=generate", "task.new_tokens=4", "batch_size=2", *GPT2_TINY],
}
HEAVY = ("transformer_train_step", "gpt2_generate", "sigmoid")


def _error(make_config, tmp_path, backend: str, dtype: str, overrides: list[str]) -> float:
    cfg = make_config(f"backend={backend}", f"dtype={dtype}", "tracking=none", "isolation=inline", *FAST_TIMING,
                      *overrides)  # fmt: skip
    outcome = run_and_record(job_spec(cfg), tmp_path / backend)
    assert outcome.status == "FINISHED", outcome.error
    return outcome.metrics["max_abs_err_vs_reference"]


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize(
    "model", [pytest.param(m, marks=pytest.mark.heavy) if m in HEAVY else m for m in MODELS]
)  # fmt: skip
def test_tnp_half_precision_errs_as_tensorflow_does(make_config, tmp_path, model, dtype):
    tensorflow = _error(make_config, tmp_path, "tensorflow", dtype, MODELS[model])
    tnp = _error(make_config, tmp_path, "tnp", dtype, MODELS[model])
    assert tensorflow / 2 <= tnp <= tensorflow * 2, f"tnp {tnp:.3g} against TensorFlow {tensorflow:.3g}"


def test_tnp_float_functions_keep_bfloat16():
    import tensorflow as tf

    from runner.backends import tnp_backend

    tnp_backend.prepare("cpu", "bfloat16")
    x = tf.ones((2, 2), tf.bfloat16)
    for name in ("exp", "sqrt", "tanh"):
        assert getattr(tnp_backend, name)(x).dtype == tf.bfloat16, name
    assert (x * 0.5).dtype == tf.bfloat16  # NumPy 2's rule: a Python float takes the array's dtype

"""task=generate on model=gpt2: the cached steps against the whole sequence recomputed, every backend's tokens and
logits against float64 NumPy, the token timing on a fake clock, compiled steps traced once, and the refusals."""

from __future__ import annotations

import re
from pathlib import Path

import h5py
import numpy as np
import pytest

from runner.backends import numpy_backend
from runner.config import ConfigError, compose
from runner.measure.job import run_and_record
from runner.models.decoder import Decoder
from runner.record.naming import job_spec
from runner.tasks import Setup
from runner.tasks.generate import Generate, Generation, token_agreement

SIZES = ["model.layers=2", "model.d_model=16", "model.heads=2", "model.vocab_size=64", "model.prompt_len=5"]
FAST = ["timing.warmup_s=0", "timing.min_warmup_calls=1", "timing.min_repeats=2", "timing.max_time_s=0.05"]
FAST += ["timing.rounds=1"]


def run(tmp_path: Path, *overrides: str):
    cfg = compose([*FAST, "model=gpt2", "task=generate", "task.new_tokens=6", *SIZES, "batch_size=3", "tracking=none"]
                  + list(overrides))  # fmt: skip
    outcome = run_and_record(job_spec(cfg), tmp_path)
    assert outcome.status == "FINISHED", outcome.error
    return outcome


def small() -> Decoder:
    return Decoder(layers=2, d_model=16, heads=2, vocab_size=64, context=32, prompt_len=5)


def numpy_setup(model: Decoder, dtype: str = "float64") -> Setup:
    rng = np.random.default_rng(0)
    params = {k: v.astype(dtype) for k, v in model.init_params(rng).items()}
    inputs = model.make_inputs(rng, 2)
    return Setup(numpy_backend, model, "eager", "cpu", params, inputs, {}, False, "full", dtype)


def test_decoding_with_the_cache_is_recomputing_the_whole_sequence():
    model = small()
    setup = numpy_setup(model)
    generation = Generation(setup, new_tokens=7)
    tokens = generation()
    sequence = np.concatenate([setup.inputs["x"], tokens[:, :-1]], axis=1)
    whole = model.forward(numpy_backend, setup.params, sequence)[:, model.prompt_len - 1 :]
    np.testing.assert_allclose(np.stack(generation.first_logits, axis=1), whole, rtol=0, atol=1e-12)
    np.testing.assert_array_equal(tokens, whole.argmax(-1))  # greedy: each token is its step's argmax


def test_a_second_generation_is_not_disturbed_by_what_the_first_left_in_the_cache():
    setup = numpy_setup(small())
    generation = Generation(setup, new_tokens=7)
    np.testing.assert_array_equal(generation(), generation())


def test_the_timed_rows_are_seconds_to_each_token_on_the_clock():
    """One clock read before and after each step: the first token's time is the prefill's (TTFT), each later
    one its decode step's; a generation's rows reach the series, which averages the rows of a sample's calls."""
    ticks = iter(np.cumsum([0, 5, 0, 1, 0, 2, 0, 3, 0, 5, 0, 1, 0, 2, 0, 3.0]))
    setup = numpy_setup(small())
    generation = Generation(setup, new_tokens=4, clock=lambda: float(next(ticks)))
    from runner.tasks.generate import TokenLatencies

    series = TokenLatencies(generation)
    series.before_block()
    generation(), generation()
    assert generation.latencies == [[5, 1, 2, 3], [5, 1, 2, 3]]
    assert series.after_block(2) == [5, 1, 2, 3]


def test_generation_metrics_come_from_every_samples_rows():
    task = Generate("generate", new_tokens=4)
    task.batch_size = 2
    rows = [[0.010, 0.001, 0.002, 0.003]] * 3 + [[0.020, 0.001, 0.001, 0.100]]
    metrics = task.metrics(0.02, {"token_latency_s": rows})
    assert metrics["tokens_per_s"] == pytest.approx(2 * 4 / 0.02)
    assert metrics["ttft_s"] == pytest.approx(0.010)
    decode = np.array([row[1:] for row in rows])
    assert metrics["tpot_p50_s"] == pytest.approx(np.percentile(decode, 50))
    assert metrics["tpot_p99_s"] == pytest.approx(np.percentile(decode, 99))
    assert metrics["decode_tokens_per_s"] == pytest.approx(2 / metrics["tpot_p50_s"])  # the figures agree
    unobserved = task.metrics(0.02, {"token_latency_s": [[float("nan")] * 4] * 3})
    assert set(unobserved) == {"tokens_per_s"}  # a generation timed whole says nothing per token


def test_token_agreement_counts_only_decided_steps():
    reference = np.array([[[0.0, 1.0, 0.2], [0.5, 0.5000001, 0.0], [2.0, 0.0, 0.0]]])  # (batch 1, 3 steps, vocab 3)
    agreed = token_agreement(np.array([[1, 0, 0]]), reference, error=1e-4)
    assert agreed == {"tokens_decided": 2.0, "tokens_differ": 0.0, "first_undecided_token": 1.0}
    wrong = token_agreement(np.array([[2, 1, 0]]), reference, error=1e-4)
    assert wrong["tokens_differ"] == 1.0  # step 0 was decided for token 1


def _case(backend: str, mode: str, dtype: str, heavy: bool = False):
    return pytest.param(backend, mode, dtype, marks=[pytest.mark.heavy] * heavy, id=f"{backend}-{mode}-{dtype}")


# The default set runs each backend once, float32 and float64 both among them; the heavy set every other pair (eager
# JAX and TensorFlow compile or dispatch op by op, torch.compile takes ~30 s on 2 cores, XLA ~15 s).
CASES = [
    _case("numpy", "eager", "float64"),
    _case("torch", "eager", "float32"),
    _case("jax", "function", "float32"),
    _case("tensorflow", "function", "float64"),
    _case("tnp", "function", "float32"),
    *(_case(b, "eager", d, heavy=True) for b, d in [("numpy", "float32"), ("torch", "float64"), ("tnp", "float64")]),
    *(_case(b, "function", d, heavy=True) for b, d in [("jax", "float64"), ("tensorflow", "float32")]),
    *(_case("torch", "function", d, heavy=True) for d in ("float32", "float64")),
    *(_case(b, m, d, heavy=True) for b, m in [("jax", "eager"), ("tensorflow", "eager")] for d in ("float32",)),
    *(_case(b, "xla", d, heavy=True) for b in ("jax", "tensorflow") for d in ("float32", "float64")),
]


@pytest.mark.parametrize(("backend", "mode", "dtype"), CASES)
def test_every_backend_generates_the_reference_tokens(tmp_path, backend, mode, dtype):
    outcome = run(tmp_path, f"backend={backend}", f"mode={mode}", f"dtype={dtype}")
    m = outcome.metrics
    assert m["within_reference_tolerance"] == 1.0, m["max_rel_err_vs_reference"]
    assert m["tokens_differ"] == 0 and m["tokens_decided"] > 0
    assert m["cache_vs_recompute_max_rel_err"] <= {"float32": 1e-5, "float64": 1e-9}[dtype]
    assert m["ttft_s"] > 0 and m["tpot_p50_s"] > 0 and m["tpot_p99_s"] >= m["tpot_p50_s"]
    itemsize = {"float32": 4, "float64": 8}[dtype]
    assert (
        m["kv_cache_mb"] * 1e6 == 2 * 2 * 3 * 2 * (5 + 6) * 8 * itemsize
    )  # layers x 2 x batch x heads x length x size
    with h5py.File(tmp_path / "tensors.h5") as f:
        assert f["outputs/tokens"].shape == (3, 6) and f["outputs/logits"].shape == (3, 6, 64)
        assert f["timings/token_latency_s"].shape == (m["n_samples"], 6)
    kernel = outcome.environment["attention_kernel"]  # the dispatcher's choice over the cache, with its mask
    assert kernel.startswith("scaled_dot_product_attention: ") if backend == "torch" else "softmax" in kernel
    if backend in ("tensorflow", "tnp", "jax") and mode != "eager":
        assert outcome.environment["decode_compilations"] == "1"  # one trace for every token: no retracing
        assert outcome.environment["prefill_compilations"] == "1"


def test_backends_generate_the_same_tokens(tmp_path):
    """Where every step is decided (first_undecided_token -1), the tokens are the same on every backend."""
    runs = {b: run(tmp_path / b, f"backend={b}", "dtype=float64") for b in ("numpy", "torch", "tensorflow")}
    assert all(r.metrics["first_undecided_token"] == -1 for r in runs.values())
    tokens = {b: h5py.File(tmp_path / b / "tensors.h5")["outputs/tokens"][()] for b in runs}
    assert all(np.array_equal(tokens["numpy"], t) for t in tokens.values())


def test_a_generation_longer_than_the_context_is_one_line(tmp_path):
    cfg = compose([*FAST, "model=gpt2", "task=generate", *SIZES, "model.context=8", "task.new_tokens=4",
                   "tracking=none"])  # fmt: skip
    outcome = run_and_record(job_spec(cfg), tmp_path)
    assert outcome.status == "FAILED"
    assert outcome.error == (
        "model.prompt_len + task.new_tokens: 9 tokens do not fit the model's context of 8 positions (model.context): "
        "lower them"
    )


def test_a_cache_beyond_the_machine_is_refused_before_it_starts(tmp_path):
    cfg = compose([*FAST, "model=gpt2_small", "task=generate", "task.new_tokens=900", "batch_size=100000",
                   "backend=numpy", "tracking=none"])  # fmt: skip
    outcome = run_and_record(job_spec(cfg), tmp_path)
    assert outcome.status == "FAILED"
    assert "of host memory" in outcome.error and "activations" in outcome.error


def test_the_cache_is_counted_as_the_issue_states_it():
    model = Decoder(layers=12, d_model=768, heads=12, vocab_size=50257, context=1024, prompt_len=32)
    elements = model.generation_elements(batch_size=4, length=32 + 96, new_tokens=96)
    cache = 12 * 2 * 4 * 12 * (32 + 96) * 64  # layers x 2 x batch x heads x (prompt + new) x head size
    assert elements["activations"] >= cache


def test_generate_runs_only_on_a_decoder(tmp_path):
    with pytest.raises(ConfigError, match="model=mlp runs only task=inference or task=gradients or task=jacobian"):
        from runner.config import check_combination

        check_combination(compose(["model=mlp", "task=generate"]))


def test_task_inference_gives_the_logits_of_the_prompt(tmp_path):
    cfg = compose([*FAST, "model=gpt2", "task=inference", *SIZES, "backend=torch", "tracking=none"])
    outcome = run_and_record(job_spec(cfg), tmp_path)
    assert outcome.status == "FINISHED", outcome.error
    assert outcome.metrics["within_reference_tolerance"] == 1.0


def test_the_report_draws_each_runs_time_per_token(tmp_path):
    from runner.record import runs
    from runner.report import frame, write_report

    run(tmp_path / "run", "backend=numpy")
    written = write_report(frame(runs.from_dirs([tmp_path / "run"])), tmp_path / "report")
    assert tmp_path / "report" / "token_latency.png" in written


def test_a_sweeps_answer_says_what_a_generation_is_with_token_columns_and_the_token_plot(tmp_path):
    """The parent's description (issue 62): what one call is, the time per generation and the token figures in both
    tables, and the token-latency plot under the chart."""
    from runner.record import runs
    from runner.report import frame
    from runner.report.sweep_answer import answer
    from runner.tracking.sweeps import description

    for backend in ("numpy", "torch"):
        run(tmp_path / backend, f"backend={backend}")
    said = answer(frame(runs.from_dirs([tmp_path / "numpy", tmp_path / "torch"])))
    assert said.call == "one call: a generation of 5 prompt + 6 new tokens, batch 3"
    headers = said.table.splitlines()[0]
    assert "| time / generation |" in headers and headers.endswith("| first token | per token (typical) | tokens/s |")
    times = re.compile(r"\d(\s|\u00a0)(ns|µs|ms|s)\b")  # a time in any unit: a busy machine may take seconds
    assert all(len(times.findall(row)) >= 3 for row in said.table.splitlines()[2:])  # filled, not blank
    assert "| first token | per token (median) | tokens/s |" in said.details.splitlines()[0]  # what the ratio is not
    artifacts = {"report/speedup.png", "report/token_latency.png"}
    info = {"parent_run_id": "r1", "overrides": ["backend=numpy,torch"], "sweep_dir": str(tmp_path)}
    page = description(info, said, [], artifacts, "1")
    assert page.index(said.call) < page.index(said.table) < page.index("report%2Fspeedup.png")
    assert page.index("report%2Fspeedup.png") < page.index("report%2Ftoken_latency.png")
    assert "the charts under the table" in page


def test_reduced_precision_is_the_runs_dtype_and_mixed_policies_are_refused(tmp_path):
    outcome = run(tmp_path / "bf16", "backend=torch", "dtype=bfloat16")
    assert outcome.metrics["within_reference_tolerance"] == 1.0 and outcome.metrics["tokens_differ"] == 0
    cfg = compose([*FAST, "model=gpt2", "task=generate", "backend=torch", "precision=bf16_mixed", "tracking=none"])
    refused = run_and_record(job_spec(cfg), tmp_path / "mixed")
    assert refused.error == (
        "model=gpt2 runs only precision=full or precision=default or precision=tf32, not precision=bf16_mixed"
    )

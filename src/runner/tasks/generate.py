"""task=generate: greedy generation with a key/value cache, timed token by token (model=gpt2).

One timed call is one whole generation for the batch: the prompt's step (prefill), which makes the first new token,
then `new_tokens - 1` decode steps, each taking the token before it. Every token is brought to the host as it is made,
as a server streams it, and the clock is read there: the first token's time is the time to first token (TTFT), each
later one's the time per output token (TPOT). The `token_latency_s` series keeps them beside every timing sample, a
row per sample (the mean over the sample's calls, one call where a generation outlasts a block), so they travel with
the samples through interleaved rounds and worker processes and reach tensors.h5 as `timings/token_latency_s`.

Checked: every step's logits against a float64 NumPy recomputation of the whole sequence without a cache (the
generated tokens fed back in), and the greedy tokens against that reference's wherever its top two logits are
further apart than twice the logits' error (there, the argmax cannot differ); the backend's own recomputation
without a cache against its cached steps.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from functools import partial
from typing import Any

import numpy as np

from runner.config import require_positive
from runner.tasks import Metric, Setup, Task, TaskRun, errors_vs_reference, with_workload_warnings

TOKEN_SERIES = "token_latency_s"


class Generation:
    """The timed call: prefill, then the decode steps, the cache reused from call to call (the positions a call has
    not written are masked, so what an earlier call left there is never read)."""

    def __init__(self, setup: Setup, new_tokens: int, clock: Callable[[], float] = time.perf_counter):
        b, workload, device = setup.backend, setup.workload, setup.device
        self.backend, self.clock, self.prompt = b, clock, setup.inputs["x"]
        batch, prompt_len = (int(n) for n in self.prompt.shape)
        self.cache_shape = shape = workload.cache_shape(batch, prompt_len + new_tokens)
        self.cache = b.new_cache(workload.layers, shape, setup.dtype, device)
        itemsize = 2 if setup.dtype == "bfloat16" else np.dtype(setup.dtype).itemsize
        self.cache_bytes = workload.layers * 2 * int(np.prod(shape)) * itemsize
        step = partial(workload.step, b)
        self.prefill = b.decoder_step(step, setup.params, self.cache, setup.mode, device)
        self.decode = b.decoder_step(step, setup.params, self.cache, setup.mode, device)
        self.starts = [b.position(prompt_len + i, device) for i in range(new_tokens - 1)]
        self.zero = b.position(0, device)
        self.latencies: list[list[float]] = []  # per call: seconds to each token
        self.first_logits: list[np.ndarray] | None = None  # the first call's logits of every step, on the host

    def __call__(self) -> np.ndarray:
        """One generation: the new tokens, (batch, new_tokens), on the host."""
        b, clock = self.backend, self.clock
        keep = self.first_logits is None
        kept: list[np.ndarray] = []
        latencies = []
        began = clock()
        logits, ids = self.prefill(self.prompt, self.zero)
        tokens = [b.to_numpy(ids)]
        latencies.append(clock() - began)
        for start in self.starts:
            if keep:
                kept.append(b.to_numpy(logits))  # between the clock reads: untimed
            began = clock()
            logits, ids = self.decode(ids, start)
            tokens.append(b.to_numpy(ids))
            latencies.append(clock() - began)
        if keep:
            self.first_logits = [*kept, b.to_numpy(logits)]
        self.latencies.append(latencies)
        return np.concatenate(tokens, axis=1)

    def describe(self, dtype: str, device: str) -> dict[str, str]:
        """How often the prefill and the decode step were traced or compiled, where the framework says; what computes
        their attention over the cache."""
        counts = {"prefill": self.backend.compilations(self.prefill), "decode": self.backend.compilations(self.decode)}
        said = {f"{step}_compilations": str(n) for step, n in counts.items() if n is not None}
        kernel = partial(self.backend.cached_attention_kernel, self.cache_shape, dtype=dtype, device=device)
        prefill, decode = kernel(queries=int(self.prompt.shape[1])), kernel(queries=1)
        said["attention_kernel"] = prefill if prefill == decode else f"prefill: {prefill}; decode: {decode}"
        return said


class WholeGeneration:
    """The timed call where the workload generates through its own API in one call (keras_hub's generate(), its
    loop compiled whole): the tokens come at the end, so per-token latency is not observable (its rows are NaN)."""

    first_logits = None  # none: the check reads the workload's logits without a cache

    def __init__(self, setup: Setup, new_tokens: int):
        generate = setup.workload.generate
        self.call = partial(generate, setup.backend, setup.params, setup.inputs["x"], new_tokens)
        self.unobserved = [float("nan")] * new_tokens
        self.latencies: list[list[float]] = []

    def __call__(self) -> np.ndarray:
        tokens = self.call()
        self.latencies.append(self.unobserved)
        return tokens

    def describe(self, dtype: str, device: str) -> dict[str, str]:
        return {}  # the workload's own generate(): what it compiles and dispatches to is its own


class TokenLatencies:
    """`token_latency_s`, a per-sample series (runner.measure.samples.Series's methods: tasks sit below measure):
    a row per timing sample, the seconds to each new token (the first: TTFT), averaged over the sample's calls."""

    def __init__(self, generation: Generation | WholeGeneration):
        self.generation = generation
        self.mark = 0

    def start(self) -> None:
        pass

    def before_block(self) -> None:
        self.mark = len(self.generation.latencies)

    def after_block(self, calls: int) -> list[float]:
        return np.mean(self.generation.latencies[self.mark :], axis=0).tolist()

    def end(self, values: list) -> list:
        return values

    def metrics(self, values: list) -> dict[str, float]:
        return {}  # Generate.metrics reads the rows


TOKEN_FIGURES = (("ttft_s", "first token"), ("tpot_p50_s", "per token p50"), ("tpot_p99_s", "p99"))


class Generate(Task):
    """Greedy generation of `new_tokens` tokens after the model's prompt: outputs/tokens and outputs/logits."""

    like = "generate"
    unit = "a generation"
    part = ("tpot_p50_s", "a token")
    metrics_shown = (
        Metric("ttft_s", "first token", "seconds"),  # time to first token: the prefill
        Metric("tpot_p50_s", "per token", "seconds"),  # per output token after it, median and tail
        Metric("tpot_p99_s", "per token p99", "seconds", in_terminal=False),
        Metric("tokens_per_s", "tokens/s"),
    )

    def __init__(self, name: str, new_tokens: int = 16):
        super().__init__(name)
        require_positive("task", new_tokens=new_tokens)
        self.new_tokens = new_tokens
        self.batch_size = 0  # known once built
        self.generation: Generation | WholeGeneration | None = None

    def check(self, workload: Any) -> None:
        if hasattr(workload, "check_length"):  # a decoder of one's own may state no context
            workload.check_length(workload.prompt_len + self.new_tokens, "model.prompt_len + task.new_tokens")

    def size_setting(self, workload: Any, batch_size: int) -> str:
        return f"{workload.size_setting(batch_size)} task.new_tokens={self.new_tokens}"

    @classmethod
    def one_call(cls, config: dict) -> str:
        model, task = config.get("model") or {}, config.get("task") or {}
        prompt, new = model.get("prompt_len", "?"), task.get("new_tokens", "?")
        return f"a generation of {prompt} prompt + {new} new tokens, batch {config.get('batch_size')}"

    @classmethod
    def page_lines(cls, config: dict, metrics: dict, environment: dict, seconds: Callable[[float], str]) -> list[str]:
        """What one call is, then time to first token, time per token (p50, p99) and tokens per second."""
        lines = [f"one call: {cls.one_call(config)}"]
        said = [f"{label} {seconds(metrics[key])}" for key, label in TOKEN_FIGURES if key in metrics]
        if "tokens_per_s" in metrics:
            said.append(f"{metrics['tokens_per_s']:.4g} tokens/s")
        return lines + ["; ".join(said)] if said else lines

    def build(self, setup: Setup) -> TaskRun:
        self.batch_size = int(setup.inputs["x"].shape[0])
        own = setup.workload.generate is not None
        generation = WholeGeneration(setup, self.new_tokens) if own else Generation(setup, self.new_tokens)
        self.generation = generation
        return TaskRun(
            generation,
            partial(_results, generation),
            with_workload_warnings(setup),
            series={TOKEN_SERIES: TokenLatencies(generation)},
        )

    def agreement(self, setup: Setup, params: dict, inputs: dict, results: dict) -> dict[str, float]:
        """Every step's logits against float64 NumPy's over the prompt and the tokens generated, without a cache; the
        tokens against that reference's greedy choice where it is decided; the backend's own logits without a cache
        against its cached steps."""
        tokens = results["outputs/tokens"]
        sequence = np.concatenate([inputs["x"], tokens[:, :-1]], axis=1)  # each step's input: the tokens before it
        start = inputs["x"].shape[1] - 1
        reference = setup.workload.reference_logits(params, sequence)[:, start:]
        forward, _ = setup.model()
        again = setup.backend.to_numpy(forward(setup.params, setup.backend.token_ids(sequence, setup.device)))
        recomputed = np.asarray(again[:, start:], np.float64)  # the backend's own, without a cache
        cached = results.get("outputs/logits")
        metrics = errors_vs_reference({"logits": recomputed if cached is None else cached}, {"logits": reference})
        metrics.update(token_agreement(tokens, reference, metrics["max_abs_err_vs_reference"]))
        if cached is not None:
            compared = errors_vs_reference({"logits": cached}, {"logits": recomputed})
            metrics["cache_vs_recompute_max_rel_err"] = compared["max_rel_err_vs_reference"]
        return metrics

    def array_elements(self, workload: Any, batch_size: int, per_example: bool) -> dict[str, int] | None:
        return workload.generation_elements(batch_size, workload.prompt_len + self.new_tokens, self.new_tokens)

    def flops(self, workload: Any, batch_size: int) -> float | None:
        return workload.generation_flops(batch_size, workload.prompt_len, self.new_tokens)

    def describe(self, setup: Setup) -> dict[str, str]:
        return self.generation.describe(setup.dtype, setup.device) if self.generation else {}

    def metrics(self, call_s: float, samples: dict[str, list]) -> dict[str, float]:
        """TTFT, TPOT's percentiles over every token of every sample, tokens per second (end to end, from the time per
        generation the comparisons use; and of the decode steps alone, from TPOT's median, so that the two figures
        a page shows of decoding agree), the key/value cache's size."""
        rows = np.asarray(samples.get(TOKEN_SERIES) or [], dtype=float)
        metrics = {"tokens_per_s": self.batch_size * self.new_tokens / call_s}
        if isinstance(self.generation, Generation):
            metrics["kv_cache_mb"] = self.generation.cache_bytes / 1e6
        if rows.ndim != 2 or not len(rows) or np.isnan(rows).all():  # no rows, or not observable
            return metrics
        metrics["ttft_s"] = float(np.median(rows[:, 0]))
        if rows.shape[1] > 1:
            decode = rows[:, 1:]
            p50, p90, p99 = np.percentile(decode, [50, 90, 99])
            metrics.update(tpot_p50_s=float(p50), tpot_p90_s=float(p90), tpot_p99_s=float(p99))
            metrics["decode_tokens_per_s"] = self.batch_size / float(p50)
        return metrics


def token_agreement(tokens: np.ndarray, reference_logits: np.ndarray, error: float) -> dict[str, float]:
    """tokens_decided: how many steps the reference's top two logits are further apart than twice the logits' largest
    error (there the argmax cannot differ: every logit is off by less than half the gap); tokens_differ: how many of
    those chose another token than the reference (0 unless greedy decoding is wrong); first_undecided_token: the
    first step that is not decided (-1: none), where another backend may fairly choose otherwise."""
    top_two = np.sort(reference_logits, axis=-1)[..., -2:]
    decided = top_two[..., 1] - top_two[..., 0] > 2 * error
    differ = decided & (tokens != reference_logits.argmax(-1))
    undecided = np.flatnonzero(~decided.all(axis=0))
    return {
        "tokens_decided": float(decided.sum()),
        "tokens_differ": float(differ.sum()),
        "first_undecided_token": float(undecided[0]) if undecided.size else -1.0,
    }


def _results(generation: Generation | WholeGeneration, tokens: np.ndarray) -> dict[str, np.ndarray]:
    """The tokens, and every step's logits where the generation showed them."""
    if generation.first_logits is None:
        return {"outputs/tokens": tokens}
    return {"outputs/tokens": tokens, "outputs/logits": np.stack(generation.first_logits, axis=1)}

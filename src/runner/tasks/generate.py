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

from runner.backends import AttentionCall
from runner.config import ConfigError, require_positive
from runner.tasks import Metric, Setup, Task, TaskRun, errors_vs_reference, with_workload_warnings
from runner.tasks.token_figures import fidelity, percentile_figures

TOKEN_SERIES = "token_latency_s"


class Generation:
    """The timed call: prefill, then the decode steps, the cache reused from call to call (the positions a call has
    not written are masked, so what an earlier call left there is never read)."""

    def __init__(
        self,
        setup: Setup,
        new_tokens: int,
        clock: Callable[[], float] = time.perf_counter,
        pad: np.ndarray | None = None,
    ):
        """pad: None, or each prompt's left padding (batch,) in a batch of prompts of different lengths."""
        b, workload, device = setup.backend, setup.workload, setup.device
        self.backend, self.clock, self.prompt = b, clock, setup.inputs["x"]
        batch, prompt_len = (int(n) for n in self.prompt.shape)
        self.cache_shape = shape = workload.cache_shape(batch, prompt_len + new_tokens)
        self.cache = b.new_cache(workload.layers, shape, setup.dtype, device)
        self.cache_bytes = workload.layers * 2 * int(np.prod(shape)) * itemsize(setup.dtype)
        # the padding is fixed for the generation: bound to each step, as the cache is
        step = partial(workload.step, b, pad=None if pad is None else b.token_ids(pad, device))
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

    def describe(self) -> dict[str, str]:
        """How often the prefill and the decode step were traced or compiled, where the framework says; what computes
        their attention over the cache."""
        counts = {"prefill": self.backend.compilations(self.prefill), "decode": self.backend.compilations(self.decode)}
        said = {f"{step}_compilations": str(n) for step, n in counts.items() if n is not None}
        batch, heads, length, size = self.cache_shape
        kernel = partial(self.backend.attention_kernel, self.cache[0][0])
        prefill = kernel(AttentionCall((batch, heads, int(self.prompt.shape[1]), size), keys=length, masked=True))
        decode = kernel(AttentionCall((batch, heads, 1, size), keys=length, masked=True))
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

    def describe(self) -> dict[str, str]:
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


def typed_lengths(lengths: object) -> list[int] | None:
    """task.prompt_lengths as typed: a list of one or more integers (not '123', 5, [1.5, 4] or [true, 4], which ran as
    something else), or None. Their range is the workload's (Generate.check)."""
    if lengths is None:
        return None
    if isinstance(lengths, list | tuple) and lengths and all(type(n) is int for n in lengths):
        return list(lengths)
    raise ConfigError(
        f"task.prompt_lengths={lengths!r}: a list of one or more prompt lengths, each 1 .. model.prompt_len "
        "(e.g. [16,3,9]), or null for every prompt model.prompt_len tokens"
    )


class Generate(Task):
    """Greedy generation of `new_tokens` tokens after the model's prompt: outputs/tokens and outputs/logits."""

    like = "generate"
    unit = "a generation"
    part = ("tpot_p50_s", "a token")
    repeated_parts = (TOKEN_SERIES, 1)  # the decode steps: every token after the first
    machine_facts = ("memory_bandwidth",)  # decoding's achieved bandwidth is read against the machine's
    metrics_shown = (
        Metric("ttft_s", "first token", "seconds", watched=1.15),  # time to first token: the prefill
        Metric("tpot_p50_s", "per token", "seconds", watched=1.10),  # per output token after it, median and tail
        Metric("tpot_p99_s", "per token p99", "seconds", in_terminal=False, watched=1.15),
        Metric("tpot_p99_lo_s", "p99 from", "seconds", in_terminal=False),  # its 95% interval: token_figures
        Metric("tpot_p99_hi_s", "p99 to", "seconds", in_terminal=False),
        Metric("tokens_per_s", "tokens/s", watched=1.10, higher_is_better=True),
        # below float64: the next-token distribution against float64's (runner.tasks.token_figures.fidelity), watched
        # as the error against float64 is (twofold), the share of top-1 tokens kept at 2%
        Metric("kl_mean", "KL mean", in_terminal=False, watched=2.0),
        Metric("kl_p999", "KL p99.9", in_terminal=False, watched=2.0),
        Metric("kl_max", "KL max", in_terminal=False, watched=2.0),
        Metric("top1_agree_share", "top-1 agrees", in_terminal=False, watched=1.02, higher_is_better=True),
        Metric("rms_dp", "RMS Δp", in_terminal=False, watched=2.0),
    )

    def __init__(self, name: str, new_tokens: int = 16, prompt_lengths: list[int] | None = None):
        """prompt_lengths: the batch's prompts of these lengths (row i the (i mod n)-th), left-padded to
        model.prompt_len, each with its own positions and the padding masked; None: every prompt model.prompt_len."""
        super().__init__(name)
        require_positive("task", new_tokens=new_tokens)
        self.new_tokens = new_tokens
        self.notes: list[str] = []  # what the percentiles rest on, where too few tokens bound them
        self.prompt_lengths = typed_lengths(prompt_lengths)
        self.batch_size = 0  # known once built
        self.generation: Generation | WholeGeneration | None = None
        self.decode_bytes: dict[str, int] = {}  # what a decode step reads, where the model says
        self.machine: dict[str, Any] | None = None  # the machine's measured bandwidth (Setup.machine)

    def check(self, workload: Any) -> None:
        if hasattr(workload, "check_length"):  # a decoder of one's own may state no context
            workload.check_length(workload.prompt_len + self.new_tokens, "model.prompt_len + task.new_tokens")
        if self.prompt_lengths:
            self._check_prompt_lengths(workload)

    def _check_prompt_lengths(self, workload: Any) -> None:
        said = f"task.prompt_lengths={self.prompt_lengths}"
        if workload.generate is not None:
            raise ConfigError(f"{said}: model={workload.name} generates through its own API, which pads no prompts")
        if not all(1 <= n <= workload.prompt_len for n in self.prompt_lengths or ()):
            raise ConfigError(
                f"{said}: each must be 1 .. model.prompt_len={workload.prompt_len}, the width the batch is "
                "left-padded to"
            )

    def padding(self, batch: int, width: int) -> np.ndarray | None:
        """Each prompt's left padding (batch,) where task.prompt_lengths is set; None where every prompt fills the
        width."""
        lengths = self.prompt_lengths
        return None if not lengths else np.array([width - lengths[i % len(lengths)] for i in range(batch)])

    def size_setting(self, workload: Any, batch_size: int) -> str:
        return f"{workload.size_setting(batch_size)} task.new_tokens={self.new_tokens}"

    @classmethod
    def one_call(cls, config: dict) -> str:
        model, task = config.get("model") or {}, config.get("task") or {}
        prompt, new = model.get("prompt_len", "?"), task.get("new_tokens", "?")
        lengths = task.get("prompt_lengths")
        if lengths:
            prompt = f"{'/'.join(str(n) for n in lengths)} (left-padded to {prompt})"
        return f"a generation of {prompt} prompt + {new} new tokens, batch {config.get('batch_size')}"

    @classmethod
    def page_lines(cls, config: dict, metrics: dict, environment: dict, seconds: Callable[[float], str]) -> list[str]:
        """What one call is, then time to first token, time per token (p50, p99) and tokens per second."""
        lines = [f"one call: {cls.one_call(config)}"]
        said = [f"{label} {seconds(metrics[key])}" for key, label in TOKEN_FIGURES if key in metrics]
        if "tpot_p99_lo_s" in metrics:  # its 95% interval; unbounded above where the tokens are too few
            upper = seconds(metrics["tpot_p99_hi_s"]) if "tpot_p99_hi_s" in metrics else "unbounded"
            said[-1] += f" [{seconds(metrics['tpot_p99_lo_s'])}, {upper}]"
        if "tokens_per_s" in metrics:
            said.append(f"{metrics['tokens_per_s']:.4g} tokens/s")
        lines += ["; ".join(said)] if said else []
        if "kl_mean" in metrics:
            lines.append(
                f"next-token distribution vs float64: KL mean {metrics['kl_mean']:.3g}, p99.9 {metrics['kl_p999']:.3g},"
                f" max {metrics['kl_max']:.3g}; top-1 agrees at {metrics['top1_agree_share']:.1%} of positions; "
                f"RMS Δp {metrics['rms_dp']:.3g}"
            )
        return lines

    def build(self, setup: Setup) -> TaskRun:
        self.batch_size = int(setup.inputs["x"].shape[0])
        if setup.workload.generate is not None:
            generation: Generation | WholeGeneration = WholeGeneration(setup, self.new_tokens)
        else:
            pad = self.padding(*setup.inputs["x"].shape)
            generation = Generation(setup, self.new_tokens, pad=pad)
            self._decode_bound(setup)
        self.generation = generation
        return TaskRun(
            generation,
            partial(_results, generation),
            with_workload_warnings(setup, lambda: self.notes),
            series={TOKEN_SERIES: TokenLatencies(generation)},
        )

    def _decode_bound(self, setup: Setup) -> None:
        """What a decode step reads, and the memory bandwidth to read it against (the host's on cpu, the GPU's peak on
        cuda)."""
        workload, (batch, width) = setup.workload, setup.inputs["x"].shape
        if hasattr(workload, "decode_bytes"):  # a decoder of one's own may not say
            self.decode_bytes = workload.decode_bytes(batch, width + self.new_tokens, itemsize(setup.dtype))
        self.machine = setup.machine.get("memory_bandwidth")

    def agreement(self, setup: Setup, params: dict, inputs: dict, results: dict) -> dict[str, float]:
        """Every step's logits against float64 NumPy's over the prompt and the tokens generated, without a cache; the
        tokens against that reference's greedy choice where it is decided; the backend's own logits without a cache
        against its cached steps."""
        tokens = results["outputs/tokens"]
        sequence = np.concatenate([inputs["x"], tokens[:, :-1]], axis=1)  # each step's input: the tokens before it
        start = inputs["x"].shape[1] - 1
        pad = self.padding(*inputs["x"].shape)
        reference = setup.workload.reference_logits(params, sequence, *([] if pad is None else [pad]))[:, start:]
        ids = setup.backend.token_ids(sequence, setup.device)
        again = setup.backend.to_numpy(_forward(setup, pad)(setup.params, ids))
        recomputed = np.asarray(again[:, start:], np.float64)  # the backend's own, without a cache
        cached = results.get("outputs/logits")
        metrics = errors_vs_reference({"logits": recomputed if cached is None else cached}, {"logits": reference})
        metrics.update(token_agreement(tokens, reference, metrics["max_abs_err_vs_reference"]))
        if setup.dtype != "float64":  # how far the next-token distribution moves from float64's
            metrics.update(fidelity(recomputed if cached is None else cached, reference, tokens))
        if cached is not None:
            compared = errors_vs_reference({"logits": cached}, {"logits": recomputed})
            metrics["cache_vs_recompute_max_rel_err"] = compared["max_rel_err_vs_reference"]
        return metrics

    def array_elements(self, workload: Any, batch_size: int, per_example: bool) -> dict[str, int] | None:
        return workload.generation_elements(batch_size, workload.prompt_len + self.new_tokens, self.new_tokens)

    def flops(self, workload: Any, batch_size: int) -> float | None:
        return workload.generation_flops(batch_size, workload.prompt_len, self.new_tokens)

    def describe(self, setup: Setup) -> dict[str, str]:
        said = self.generation.describe() if self.generation else {}
        if self.machine:
            m = self.machine
            said["machine_bandwidth_GBps"] = f"{m['GBps']:.4g}"
            said["machine_bandwidth"] = m.get("how") or (  # a GPU's peak says how; the host's STREAM figure:
                f"STREAM Copy {m['copy_GBps']:.3g} GB/s, Add {m['add_GBps']:.3g} GB/s in NumPy on {m['threads']} "
                f"threads, {m['array_MB']:.0f} MB arrays; measured {m['measured']} on {m['machine']}"
            )
        return said

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
            figures, self.notes = percentile_figures(rows[:, 1:])
            metrics.update(figures)
            metrics["decode_tokens_per_s"] = self.batch_size / figures["tpot_p50_s"]
            metrics.update(self._bandwidth(figures["tpot_p50_s"]))
        return metrics

    def _bandwidth(self, step_s: float) -> dict[str, float]:
        """Bytes a decode step reads, over its median time: the bandwidth decoding achieves, and its share of the
        machine's measured one."""
        if not self.decode_bytes:
            return {}
        read = sum(self.decode_bytes.values())
        said = {"decode_bytes_per_token": float(read), "decode_bandwidth_GBps": read / step_s / 1e9}
        if self.machine:
            said["decode_bandwidth_share"] = said["decode_bandwidth_GBps"] / self.machine["GBps"]
        return said


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


def itemsize(dtype: str) -> int:
    return 2 if dtype == "bfloat16" else np.dtype(dtype).itemsize


def _forward(setup: Setup, pad: np.ndarray | None) -> Callable:
    """The backend's forward(params, ids) of the whole sequence, without a cache, each prompt's padding masked."""
    if pad is None:
        return setup.model()[0]
    return partial(setup.workload.forward, setup.backend, pad=setup.backend.token_ids(pad, setup.device))


def _results(generation: Generation | WholeGeneration, tokens: np.ndarray) -> dict[str, np.ndarray]:
    """The tokens, and every step's logits where the generation showed them."""
    if generation.first_logits is None:
        return {"outputs/tokens": tokens}
    return {"outputs/tokens": tokens, "outputs/logits": np.stack(generation.first_logits, axis=1)}

#!/usr/bin/env python
"""Parity: does the runner time the code users write? Its median beside a short hand-written loop.

    .venv/bin/python benchmarks/parity.py              # every row; rewrites the parity section of BENCHMARKS.md
    .venv/bin/python benchmarks/parity.py --backends torch --rows mlp_gradients_eager --rounds 3 --out -

For each backend x workload, one process per backend: in every round the runner measures the job
(`runner.job.run_job`, isolation inline, `timing.max_time_s` = the budget), then the hand-written loop
is measured for the same budget (timeit in blocks of >= 2 ms; torch.utils.benchmark on cuda); the row
is the median over rounds of runner / hand-written. A row whose ratios spread more than 10% is measured
once more (the machine was disturbed) and both attempts are shown. Target: ratio <= 1.05.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import time
import timeit
from collections.abc import Callable
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

BEGIN, END = "<!-- parity:begin -->", "<!-- parity:end -->"
TARGET = 1.05
BLOCK_S = 0.002  # the hand-written side's block, the runner's timing.min_block_s
DISTURBED_SPREAD = 0.10  # ratios of one row's rounds further apart than this: measure the row again
BACKENDS = ("numpy", "torch", "tensorflow")
WORKLOADS = {  # row -> the runner's overrides
    "mlp_gradients_eager": ("model=mlp", "task=gradients", "mode=eager"),
    "mlp_gradients_compiled": ("model=mlp", "task=gradients", "mode=function"),
    "mlp_jacobian": ("model=mlp", "task=jacobian", "mode=eager"),
    "mlp_inference": ("model=mlp", "task=inference", "mode=eager"),
    "resnet18_inference_b8": ("model=resnet18", "task=inference", "mode=eager", "batch_size=8"),
    "matmul": ("model=matmul", "task=inference", "mode=eager", "model.n=1000"),
}
BATCH, N = 32, 1000  # the MLP's batch (the runner's default) and the matmul's size, as in WORKLOADS
Loops = dict[str, list[tuple[str, Callable[[], object]]]]  # row -> [(idiom, call)]


# -- the hand-written side: short, everyday code, the batch passed as a training step takes it ----------------


def numpy_loops(device: str) -> Loops:
    rng = np.random.default_rng(0)
    w1, b, w2 = (rng.standard_normal(s).astype(np.float32) for s in ((64, 32), (64,), (2, 64)))
    x, t = rng.standard_normal((BATCH, 32)).astype(np.float32), rng.standard_normal((BATCH, 2)).astype(np.float32)
    a = rng.uniform(size=(N, N)).astype(np.float32)

    def predict(x):
        return np.maximum(x @ w1.T + b, 0) @ w2.T

    def gradients(x, t):  # backprop by hand: numpy has no autodiff
        pre = x @ w1.T + b
        hidden = np.maximum(pre, 0)
        d_y = 2 * (hidden @ w2.T - t)
        d_pre = (d_y @ w2) * (pre > 0)
        return d_pre.T @ x, d_pre.sum(0), d_y.T @ hidden

    def jacobian(x):
        return np.einsum("oh,bh,hi->boi", w2, (x @ w1.T + b > 0).astype(x.dtype), w1)

    return {
        "mlp_gradients_eager": [("explicit backprop", lambda: gradients(x, t))],
        "mlp_jacobian": [("einsum of the chain rule", lambda: jacobian(x))],
        "mlp_inference": [("x @ w1.T ...", lambda: predict(x))],
        "matmul": [("a @ a", lambda: a @ a)],
    }


def torch_loops(device: str) -> Loops:
    import torch
    import torch.nn.functional as F
    import torchvision

    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 2, bias=False))
    model = model.to(device)
    weights = tuple(model.parameters())
    x, t = torch.randn(BATCH, 32, device=device), torch.randn(BATCH, 2, device=device)
    compiled = torch.compile(model)
    resnet = torchvision.models.resnet18().eval().to(device)
    images, a = torch.randn(8, 3, 224, 224, device=device), torch.rand(N, N, device=device)

    def gradients(net, x, t):
        return torch.autograd.grad(F.mse_loss(net(x), t, reduction="sum"), weights)

    def jacobian_vectorized(x):  # examples are independent: the jacobian of the batch-summed output
        return torch.autograd.functional.jacobian(lambda x: model(x).sum(0), x, vectorize=True)

    def jacobian_per_output(x):
        x = x.detach().requires_grad_()
        y = model(x).sum(0)
        return torch.stack([torch.autograd.grad(y[o], x, retain_graph=True)[0] for o in range(len(y))], 1)

    @torch.inference_mode()
    def predict(net, x):
        return net(x)

    return {
        "mlp_gradients_eager": [("nn.Sequential + torch.autograd.grad", lambda: gradients(model, x, t))],
        "mlp_gradients_compiled": [("torch.compile(model) + torch.autograd.grad", lambda: gradients(compiled, x, t))],
        "mlp_jacobian": [
            ("autograd.functional.jacobian(vectorize=True)", lambda: jacobian_vectorized(x)),
            ("autograd.grad per output", lambda: jacobian_per_output(x)),
        ],
        "mlp_inference": [("nn.Sequential under inference_mode", lambda: predict(model, x))],
        "resnet18_inference_b8": [("torchvision resnet18 under inference_mode", lambda: predict(resnet, images))],
        "matmul": [("a @ a", lambda: a @ a)],
    }


def tensorflow_loops(device: str) -> Loops:
    from runner.backends import tensorflow_backend as tfb
    from runner.models.vision import VisionModel

    tf = tfb.tf
    rng = np.random.default_rng(0)
    w1, b, w2 = (tf.Variable(rng.standard_normal(s), dtype=tf.float32) for s in ((32, 64), (64,), (64, 2)))
    x = tf.constant(rng.standard_normal((BATCH, 32)), tf.float32)
    t = tf.constant(rng.standard_normal((BATCH, 2)), tf.float32)
    a = tf.constant(rng.uniform(size=(N, N)), tf.float32)
    resnet = VisionModel("resnet18", 224)
    params = {k: tfb.asarray(tfb.to_native_layout(v), device, "float32") for k, v in resnet.init_params(rng).items()}
    images = tfb.asarray(rng.standard_normal((8, 3, 224, 224)), device, "float32")

    def predict(x):
        return tf.matmul(tf.nn.relu(tf.matmul(x, w1) + b), w2)

    def gradients(x, t):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(tf.square(predict(x) - t))
        return tape.gradient(loss, [w1, b, w2])

    def jacobian(x):
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = predict(x)
        return tape.batch_jacobian(y, x)

    compiled = tf.function(gradients)
    return {
        "mlp_gradients_eager": [("tf.Variable + GradientTape", lambda: gradients(x, t))],
        "mlp_gradients_compiled": [("tf.function(GradientTape step)", lambda: compiled(x, t))],
        "mlp_jacobian": [("GradientTape.batch_jacobian", lambda: jacobian(x))],
        "mlp_inference": [("tf.matmul ...", lambda: predict(x))],
        "resnet18_inference_b8": [
            ("the runner's tf.nn resnet18, called in a plain loop", lambda: resnet.forward(tfb, params, images))
        ],
        "matmul": [("tf.matmul(a, a)", lambda: tf.matmul(a, a))],
    }


LOOPS = {"numpy": numpy_loops, "torch": torch_loops, "tensorflow": tensorflow_loops}


# -- measuring ------------------------------------------------------------------------------------------------


def runner_measure(backend: str, device: str, row: str, budget: float) -> dict:
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from runner.job import run_job

    overrides = [f"backend={backend}", f"device={device}", *WORKLOADS[row], "tracking=none", "isolation=inline"]
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = compose(config_name="config", overrides=[*overrides, f"timing.max_time_s={budget}"])
    return run_job(cfg).metrics


def hand_median(call: Callable[[], object], backend: str, device: str, budget: float) -> float:
    """The hand-written loop timed as its author would: warm up, then timeit in blocks of >= 2 ms (the
    blocks of torch.utils.benchmark's blocked_autorange; short blocks let a median step over a busy
    machine's stalls, as the runner's do) for the budget, the median block."""
    if device == "cuda":
        import torch.utils.benchmark as benchmark

        return benchmark.Timer("call()", globals={"call": call}).blocked_autorange(min_run_time=budget).median
    end = time.perf_counter() + 0.2
    while time.perf_counter() < end:
        call()
    timer = timeit.Timer(call)
    number = 1
    while timer.timeit(number) < BLOCK_S:
        number *= 2
    times, end = [], time.perf_counter() + budget
    while time.perf_counter() < end or len(times) < 5:
        times.append(timer.timeit(number))
    return statistics.median(times) / number


def measure_row(backend: str, device: str, row: str, idiom: str, call, rounds: int, budget: float) -> dict:
    ratios, ours, theirs, first_call = [], [], [], None
    for _ in range(rounds):
        metrics = runner_measure(backend, device, row, budget)
        first_call = metrics["first_call_s"] if first_call is None else first_call
        ours.append(metrics["time_median_s"])
        theirs.append(hand_median(call, backend, device, budget))
        ratios.append(ours[-1] / theirs[-1])
    return {
        "backend": backend,
        "device": device,
        "row": row,
        "idiom": idiom,
        "runner_s": statistics.median(ours),
        "hand_s": statistics.median(theirs),
        "ratio": statistics.median(ratios),
        "ratio_min": min(ratios),
        "ratio_max": max(ratios),
        "first_call_s": first_call,
        "rounds": rounds,
    }


def worker(backend: str, device: str, rows: list[str], rounds: int, budget: float) -> None:
    """Measure one backend's rows in this process; one JSON line per row on stdout."""
    loops = LOOPS[backend](device)
    for row in rows:
        for idiom, call in loops.get(row, []):
            result = measure_row(backend, device, row, idiom, call, rounds, budget)
            if result["ratio_max"] - result["ratio_min"] > DISTURBED_SPREAD:
                retry = measure_row(backend, device, row, idiom, call, rounds, budget)
                retry["first_attempt"] = result["ratio"]
                result = retry
            print("ROW " + json.dumps(result), flush=True)


def gpu_name(device: str) -> str:
    if device != "cuda":
        return ""
    import torch

    return torch.cuda.get_device_name()


# -- the report -----------------------------------------------------------------------------------------------


def format_time(seconds: float) -> str:
    from runner.timing import format_seconds

    return format_seconds(seconds)


def table_row(r: dict) -> str:
    ok = r["ratio"] <= TARGET
    retried = f"; re-measured, first attempt {r['first_attempt']:.3f}" if "first_attempt" in r else ""
    device = r["device"] + (f" ({r['gpu']})" if r.get("gpu") else "")
    return (
        f"| {r['backend']} | {device} | {r['row']} | {r['idiom']} | {format_time(r['runner_s'])} | "
        f"{format_time(r['hand_s'])} | **{r['ratio']:.3f}** ({r['ratio_min']:.3f}-{r['ratio_max']:.3f}) | "
        f"{format_time(r['first_call_s'])} | {'meets target' if ok else 'MISSES target'}{retried} |"
    )


def section(results: list[dict], conditions: str) -> str:
    lines = [
        BEGIN,
        "## Parity with hand-written loops",
        "",
        "Regenerate: `.venv/bin/python benchmarks/parity.py` (rewrites only this section; `run_all.py` keeps it). "
        "Per row, in one process per backend and interleaved round by round: the runner's median "
        "(`run_job`, isolation inline) and the median of a short hand-written loop kept in `benchmarks/parity.py` "
        "(0.2 s of warm-up, then timeit in blocks of >= 2 ms for the same budget, the median block; the batch passed "
        "as arguments). Ratio = runner / "
        f"hand-written, the median over paired rounds (range in brackets); target <= {TARGET}. A row whose "
        f"rounds spread more than {DISTURBED_SPREAD:.0%} was measured again and says so. First call: the runner's "
        "first call in the row's first round (tracing, compilation, torch.autograd's start-up).",
        "",
        conditions,
        "",
        "| backend | device | workload | hand-written idiom | runner median | hand-written median | ratio | "
        "runner first call | verdict |",
        "|---|---|---|---|---|---|---|---|---|",
        *(table_row(r) for r in results),
        END,
    ]
    return "\n".join(lines)


def replace_section(text: str, new: str) -> str:
    """`text` with its parity section replaced by `new` (appended where there is none)."""
    if BEGIN in text and END in text:
        return text[: text.index(BEGIN)] + new + text[text.index(END) + len(END) :]
    return text.rstrip("\n") + "\n\n" + new + "\n"


def conditions(args, load_before: float, load_after: float) -> str:
    from runner.environment import cpu_name

    return (
        f"Conditions: {cpu_name()}, {os.cpu_count()} cores shared with other work (load average {load_before:.2f} "
        f"before, {load_after:.2f} after); Python {platform.python_version()}; {args.rounds} rounds of "
        f"{args.budget:g} s per side; float32; MLP batch {BATCH}; matmul n={N}; {datetime.date.today().isoformat()}."
    )


def run_backend(backend: str, args) -> list[dict]:
    command = [sys.executable, __file__, "--worker", backend, "--device", args.device, "--rounds", str(args.rounds)]
    command += ["--budget", str(args.budget), "--rows", ",".join(args.rows)]
    done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT)
    rows = [json.loads(line[4:]) for line in done.stdout.splitlines() if line.startswith("ROW ")]
    if done.returncode != 0:
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        print(f"warning: the {backend} worker failed: {tail}", file=sys.stderr)
    return rows


# -- command line ---------------------------------------------------------------------------------------------


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backends", default=",".join(BACKENDS), help="comma-separated: " + ", ".join(BACKENDS))
    parser.add_argument("--rows", default=",".join(WORKLOADS), help="comma-separated: " + ", ".join(WORKLOADS))
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--budget", type=float, default=1.0, help="seconds per side per round")
    out_help = "file whose parity section is rewritten; - prints"
    parser.add_argument("--out", default=str(ROOT / "BENCHMARKS.md"), help=out_help)
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.backends, args.rows = args.backends.split(","), args.rows.split(",")
    bad = [b for b in args.backends if b not in BACKENDS] + [r for r in args.rows if r not in WORKLOADS]
    if bad or args.rounds < 1 or args.budget <= 0:
        what = ", ".join(bad) if bad else f"--rounds {args.rounds} --budget {args.budget}"
        parser.exit(2, f"error: not a backend, row or positive count/budget: {what}\n")
    return args


def main(argv: list[str]) -> None:
    args = parse(argv)
    if args.worker:
        worker(args.worker, args.device, args.rows, args.rounds, args.budget)
        return
    load_before = os.getloadavg()[0]
    results = []
    for backend in args.backends:
        rows = run_backend(backend, args)
        for r in rows:
            r["gpu"] = gpu_name(args.device) if backend == "torch" else ""
            print(table_row(r), flush=True)
        results += rows
    text = section(results, conditions(args, load_before, os.getloadavg()[0]))
    if args.out == "-":
        print(text)
        return
    out = Path(args.out)
    out.write_text(replace_section(out.read_text() if out.exists() else "", text))
    print(f"wrote the parity section of {out}")


if __name__ == "__main__":
    main(sys.argv[1:])

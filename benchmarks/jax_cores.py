"""JAX on CPU across cores against pinned to one: a plain loop, no runner (BENCHMARKS.md, *JAX on two cores*).

Each JAX call hands its work from the Python thread to XLA's and waits for it back. This times the MLP's
gradients (the runner's default workload) the way the runner's rounds do: turns of blocks of calls, a pause
between turns (--pause), each turn's fastest block; once with the process's own CPUs and once pinned to the first.

    .venv/bin/python benchmarks/jax_cores.py            # jitted; --eager for op by op
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

import numpy as np

from runner.measure import idle_poll

TURNS, BLOCKS = 30, 40


def loop(eager: bool, pause_s: float) -> tuple[float, float]:
    """The median block time (s a call) and the IQR / median of the turns' fastest blocks."""
    import jax
    import jax.numpy as jnp

    rng = np.random.default_rng(0)
    shapes = {"w1": (32, 64), "b": (64,), "w2": (64, 2)}
    w = {k: jnp.asarray(rng.standard_normal(s), dtype=jnp.float32) for k, s in shapes.items()}
    x, t = (jnp.asarray(rng.standard_normal(s), dtype=jnp.float32) for s in ((32, 32), (32, 2)))

    def loss(w, x, t):
        return jnp.mean((jax.nn.relu(x @ w["w1"] + w["b"]) @ w["w2"] - t) ** 2)

    gradients = jax.grad(loss) if eager else jax.jit(jax.grad(loss))
    calls = 1 if eager else 50  # a block of about 2 ms, as the runner calibrates it
    for _ in range(200):
        jax.block_until_ready(gradients(w, x, t))
    blocks, fastest = [], []
    for _ in range(TURNS):
        time.sleep(pause_s)  # the other jobs' turns
        turn = []
        for _ in range(BLOCKS):
            start = time.perf_counter()
            for _ in range(calls):
                jax.block_until_ready(gradients(w, x, t))
            turn.append((time.perf_counter() - start) / calls)
        blocks += turn
        fastest.append(min(turn))
    q75, q25 = np.percentile(fastest, [75, 25])
    return float(np.median(blocks)), float((q75 - q25) / np.median(fastest))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--eager", action="store_true", help="op by op (default: jax.jit)")
    parser.add_argument("--repeats", type=int, default=2, help="alternate the two settings this many times")
    parser.add_argument("--pause", type=float, default=0.2, help="seconds between turns (0: one after the other)")
    parser.add_argument("--poll-idle", action="store_true", help="idle CPUs poll meanwhile (timing.poll_idle; root)")
    parser.add_argument("--child", choices=["all", "one"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        if args.child == "one":
            os.sched_setaffinity(0, sorted(os.sched_getaffinity(0))[:1])  # before JAX starts its threads
        with idle_poll.polling(args.poll_idle) as held:
            if held.get("cpu_idle_polled") is False:
                raise SystemExit(f"--poll-idle: {held['cpu_idle_poll_unavailable_reason']}")
            median, spread = loop(args.eager, args.pause)
        print(f"{median * 1e6:.1f} µs a call, turns' fastest blocks IQR {spread:.1%}")
        return
    print(f"JAX MLP gradients, {'eager' if args.eager else 'jax.jit'}, {len(os.sched_getaffinity(0))} CPUs allowed")
    for _ in range(args.repeats):
        for cpus in ("all", "one"):
            command = [sys.executable, __file__, "--child", cpus, "--pause", str(args.pause)]
            command += [flag for flag, on in (("--eager", args.eager), ("--poll-idle", args.poll_idle)) if on]
            out = subprocess.run(command, capture_output=True, text=True, check=True).stdout.strip()
            print(f"  {'every CPU' if cpus == 'all' else 'one CPU  '}: {out}")


if __name__ == "__main__":
    main()

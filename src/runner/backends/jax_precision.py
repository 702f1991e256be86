"""precision= on JAX (runner.precision): the default matmul precision, and for bf16_mixed the casts JAX's mixed
precision policies (jmp) make: weights and inputs to bfloat16 inside the model function, its result to float32.

JAX is imported inside the functions: only the backend modules import a framework at module level.
"""

from __future__ import annotations

from collections.abc import Callable

from runner.config import ConfigError
from runner.precision import device_refusal

COMPUTE = {"bf16_mixed": "bfloat16"}  # fp16_mixed has no loss scaling in JAX itself: conf/precision refuses it
SHIPPED: dict = {}  # jax_default_matmul_precision as imported (None: XLA's own choice per device)
MATMUL = {"full": "highest", "tf32": "tensorfloat32", "bf16_mixed": "highest"}


def remember_shipped() -> None:
    """Called by jax_backend at import, before anything changes the setting."""
    import jax

    SHIPPED["matmul"] = _matmul_precision(jax)


def set_precision(precision: str, device: str) -> dict:
    import jax

    if precision not in (*MATMUL, "default"):
        raise ConfigError(f"precision={precision} runs on backend=torch or tensorflow, not backend=jax")
    if precision == "tf32" and device != "cuda":
        raise ConfigError(device_refusal(precision, device))
    if precision == "tf32":
        _require_tf32(jax)
    jax.config.update("jax_default_matmul_precision", MATMUL.get(precision, SHIPPED["matmul"]))
    matmul = _matmul_precision(jax)
    return {
        "precision_policy": _policy_words(precision),
        "jax_default_matmul_precision": "None (XLA's default for the device)" if matmul is None else str(matmul),
    }


def _matmul_precision(jax) -> str | None:
    # jax.config.read() refuses this flag (it has a context manager); the attribute is untyped for mypy
    return getattr(jax.config, "jax_default_matmul_precision")  # noqa: B009


def _require_tf32(jax) -> None:
    device = jax.devices("gpu")[0]
    capability = str(getattr(device, "compute_capability", "0.0"))
    if tuple(int(part) for part in capability.split(".")[:2]) < (8, 0):
        raise ConfigError(
            f"precision=tf32 needs an NVIDIA GPU with TF32 (Ampere or newer); {device.device_kind} (compute "
            f"capability {capability}) has none"
        )


def _policy_words(precision: str) -> str:
    if precision in COMPUTE:
        return (
            f"weights and inputs cast to {COMPUTE[precision]} inside the model function (jmp's policy), its result "
            "cast to float32; float32 weights, gradients and optimizer"
        )
    return {"full": "float32, TF32 off", "default": "JAX as shipped", "tf32": "TF32 matmuls and convolutions"}[
        precision
    ]


def with_precision(fn: Callable, precision: str, device: str) -> Callable:
    if precision not in COMPUTE:
        return fn
    import jax
    import jax.numpy as jnp

    compute = jnp.dtype(COMPUTE[precision])

    def to(dtype, tree):
        return jax.tree.map(lambda a: a.astype(dtype) if jnp.issubdtype(a.dtype, jnp.floating) else a, tree)

    def mixed(*args):
        return to(jnp.float32, fn(*to(compute, args)))

    return mixed

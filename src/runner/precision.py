"""`precision=`: the float32 matmul precision and mixed-precision policy a run computes with (conf/precision/).

`full` is float32 everywhere with TF32 off; `default` each framework as shipped; `tf32` TF32 matmuls and
convolutions; `bf16_mixed` and `fp16_mixed` bfloat16 or float16 compute on float32 weights. Each backend applies
a policy (`Backend.set_precision`, `Backend.with_precision`); here are the rules that refuse what cannot run,
read from the policy's `supports:` without importing any framework, and the tolerance of the reference check.

Imports nothing of the runner but its ConfigError (runner.errors): runner.config calls check_precision.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from runner.errors import ConfigError

# The dtype matmuls compute in under each policy ("tfloat32": float32 inputs rounded to TF32's 10-bit mantissa);
# under full and default it is the run's dtype.
COMPUTE = {"tf32": "tfloat32", "bf16_mixed": "bfloat16", "fp16_mixed": "float16"}
MIXED = ("bf16_mixed", "fp16_mixed")  # low-precision compute on float32 weights: what with_precision wraps

# Largest max-norm relative error vs the float64 reference that a correct computation in this dtype shows on the
# runner's workloads. float64 and float32: about a hundred unit roundoffs (2**-53, 2**-24). bfloat16 (2**-9):
# bf16_mixed MLP gradients measured 6.1e-2 on torch, TensorFlow and JAX alike (relu masks flipped by the rounding,
# batch sums that cancel), the transformer's 1.1e-2; the MLP's per-example gradients (1.8e-1) and jacobians
# (1.1e-1) go past it, the same on all three (docs/precision.md). float16 and TF32 (2**-11): a quarter of bfloat16's.
REL_TOLERANCE = {"float64": 1e-9, "float32": 1e-5, "tfloat32": 2.5e-2, "float16": 2.5e-2, "bfloat16": 1e-1}


def precision_refusal(precision: Mapping[str, Any], model: Mapping[str, Any], c: Mapping[str, str]) -> str | None:
    """Why `precision` cannot run with these choices (c: backend, device, dtype, model ...), in one line; None
    when it can. Reads the policy's `supports:` (backends, dtypes, devices) and the model's
    `supports.precisions`."""
    name = str(precision["name"])
    supports = precision.get("supports") or {}
    backends = supports.get("backends")
    if backends is not None and c["backend"] not in backends:
        allowed = " or ".join(f"backend={b}" for b in backends)
        if set(backends) == {"torch", "tensorflow", "jax"}:
            return only_full(c["backend"], name)
        return f"precision={name} runs on {allowed}, not backend={c['backend']}"
    dtypes = supports.get("dtypes")
    if dtypes is not None and c["dtype"] not in dtypes:
        keeps = " keeps float32 weights:" if name in MIXED else ""
        return f"precision={name}{keeps} it needs dtype={' or '.join(dtypes)}, not dtype={c['dtype']}"
    devices = supports.get("devices")  # device=auto: refused by the backend once it resolved it (device_refusal)
    if devices is not None and c["device"] not in (*devices, "auto"):
        return device_refusal(name, c["device"])
    model_allows = (model.get("supports") or {}).get("precisions")
    if model_allows is not None and name not in model_allows:
        only = " or ".join(f"precision={p}" for p in model_allows)
        return f"model={c['model']} runs only {only}, not precision={name}"
    return None


def check_precision(precision: Mapping[str, Any], model: Mapping[str, Any], c: Mapping[str, str]) -> None:
    """Raise ConfigError with precision_refusal's line."""
    refusal = precision_refusal(precision, model, c)
    if refusal:
        raise ConfigError(refusal)


NEEDS = {  # what the cuda-only policies need (conf/precision/NAME.yaml: supports.devices: [cuda])
    "tf32": "an NVIDIA GPU with TF32 (Ampere or newer)",
    "fp16_mixed": "an NVIDIA GPU (float16 compute with loss scaling is cuda only)",
}


def device_refusal(precision: str, device: str) -> str:
    """The one line refusing a cuda-only policy on `device` (the config's, or the one device=auto resolved to)."""
    return f"precision={precision} needs {NEEDS.get(precision, 'device=cuda')}; device={device} has none"


def only_full(backend: str, precision: str) -> str:
    """The one line a backend that computes only precision=full (numpy, tnp) gives for any other policy."""
    others = "backend=torch, tensorflow or jax"
    return f"precision={precision} runs on {others}; backend={backend} computes only precision=full"


def compute_dtype(dtype: str, precision: str, device: str) -> str:
    """The dtype the run's matmuls compute in. `default` on cuda in float32 counts as TF32: TensorFlow and JAX
    ship with TF32 matmuls on (Ampere or newer), and torch with TF32 convolutions."""
    if precision == "default" and device == "cuda" and dtype == "float32":
        return "tfloat32"
    return COMPUTE.get(precision, dtype)


def reference_tolerance(dtype: str, precision: str, device: str) -> float:
    """The max relative error vs the float64 reference that this dtype, policy and device are held to."""
    return REL_TOLERANCE[compute_dtype(dtype, precision, device)]


def tolerance_metrics(metrics: dict, dtype: str, precision: str, device: str) -> dict[str, float]:
    """reference_tolerance (the max relative error this dtype and precision policy are held to)
    and within_reference_tolerance (1 or 0), where the reference was compared."""
    if "max_rel_err_vs_reference" not in metrics:
        return {}
    tolerance = reference_tolerance(dtype, precision, device)
    within = metrics["max_rel_err_vs_reference"] <= tolerance
    return {"reference_tolerance": tolerance, "within_reference_tolerance": float(within)}

"""precision= on torch (runner.precision): the float32 matmul settings, torch.autocast around the model for the
mixed policies, and torch.amp.GradScaler for fp16_mixed's training steps (torch_backend.train_step).

torch is imported inside the functions: only the backend modules import a framework at module level.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from runner.config import ConfigError
from runner.precision import device_refusal

if TYPE_CHECKING:
    import torch

AUTOCAST = {"bf16_mixed": "bfloat16", "fp16_mixed": "float16"}  # policy -> the dtype torch.autocast computes in
SHIPPED: dict = {}  # torch's settings as imported, before prepare() turned TF32 off: what precision=default restores
POLICY = {"name": "full"}  # the run's policy, set by set_precision: torch_backend.train_step reads it
LOSS_SCALED = ("fp16_mixed",)  # the policies whose training steps scale the loss


def remember_shipped() -> None:
    """Called by torch_backend at import, before anything changes the settings."""
    import torch

    SHIPPED.update(
        matmul=torch.get_float32_matmul_precision(),
        cuda_matmul_tf32=torch.backends.cuda.matmul.allow_tf32,
        cudnn_tf32=torch.backends.cudnn.allow_tf32,
    )


def set_precision(precision: str, device: str) -> dict:
    import torch

    if precision in ("tf32", "fp16_mixed") and device != "cuda":
        raise ConfigError(device_refusal(precision, device))
    if precision == "tf32":
        _require_tf32(torch)
        torch.set_float32_matmul_precision("high")  # TF32 matmuls (also sets cuda.matmul.allow_tf32)
        torch.backends.cudnn.allow_tf32 = True
    elif precision == "default":
        torch.set_float32_matmul_precision(SHIPPED["matmul"])
        torch.backends.cuda.matmul.allow_tf32 = SHIPPED["cuda_matmul_tf32"]
        torch.backends.cudnn.allow_tf32 = SHIPPED["cudnn_tf32"]
    else:  # full and the mixed policies: what is left in float32 computes in full float32
        torch.set_float32_matmul_precision("highest")
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    POLICY["name"] = precision
    return {
        "precision_policy": _policy_words(precision, device),
        "torch_float32_matmul_precision": torch.get_float32_matmul_precision(),
        "torch_cuda_matmul_allow_tf32": bool(torch.backends.cuda.matmul.allow_tf32),
        "torch_cudnn_allow_tf32": bool(torch.backends.cudnn.allow_tf32),
    }


def _require_tf32(torch) -> None:
    major, minor = torch.cuda.get_device_capability()
    if major < 8:
        name = torch.cuda.get_device_name()
        raise ConfigError(
            f"precision=tf32 needs an NVIDIA GPU with TF32 (Ampere or newer); {name} (compute capability "
            f"{major}.{minor}) has none"
        )


def _policy_words(precision: str, device: str) -> str:
    if precision in AUTOCAST:
        scaled = "; training steps scale the loss with torch.amp.GradScaler" if precision == "fp16_mixed" else ""
        return (
            f"torch.autocast(device_type={device!r}, dtype=torch.{AUTOCAST[precision]}) around the model, its result "
            f"cast to float32; float32 weights, gradients and optimizer{scaled}"
        )
    return {"full": "float32, TF32 off", "default": "torch as shipped", "tf32": "TF32 matmuls and convolutions"}[
        precision
    ]


def with_precision(fn: Callable, precision: str, device: str) -> Callable:
    if precision not in AUTOCAST:
        return fn
    import torch

    dtype = getattr(torch, AUTOCAST[precision])

    def autocast(*args):
        with torch.autocast(device_type=device, dtype=dtype):
            out = fn(*args)
        return out.float() if out.is_floating_point() else out

    return autocast


def attention_dtype(dtype: torch.dtype, precision: str | None = None) -> torch.dtype:
    """The dtype scaled_dot_product_attention gets from activations of `dtype` under `precision` (the run's policy
    by default): under a mixed policy the projections feeding attention run in torch.autocast, which casts every
    floating dtype but float64 to its compute dtype."""
    import torch

    precision = POLICY["name"] if precision is None else precision
    if precision in AUTOCAST and dtype.is_floating_point and dtype != torch.float64:
        return getattr(torch, AUTOCAST[precision])
    return dtype


def grad_scaler(device: str):
    """fp16_mixed's loss scaler for a training step; None under any other policy."""
    if POLICY["name"] not in LOSS_SCALED:
        return None
    import torch

    return torch.amp.GradScaler(device)

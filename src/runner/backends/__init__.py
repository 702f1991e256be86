"""Backends: one module per framework, each exposing the SAME functions, imported only when chosen.

Every backend module defines:

  prepare(device, dtype) -> str          configure the framework for a run; resolve device "auto";
                                           raise ConfigError when the device or dtype cannot be used
  asarray(array, device, dtype)          numpy float64 array -> native array on device, in dtype
  to_numpy(native) -> np.ndarray         back to host numpy (bfloat16 comes back as float32)
  synchronizer(device) -> () -> None     waits for queued device work; a no-op where none is queued
  compile_model(fn, mode, device) -> fn  compile the model (forward or loss) where the framework's idiom
                                           compiles the model and differentiates it from outside (torch)
  compile(fn, mode, device) -> fn        compile the whole step (TF: tape inside tf.function); identity on torch
  trainable(params) -> dict              the weights as the framework trains them (torch: leaves requiring grad)
  grad(loss, manual) -> fn               d loss / d params: fn(params, x, labels) -> {name: array}
  per_example_grad(loss, mode, manual)   the same with a leading batch axis (vectorized or looped)
  batch_jacobian(forward, manual) -> fn  fn(params, x) -> (batch, outputs, inputs)
  reset_peak_memory(device), peak_device_mb(device) -> float | None
  environment(device) -> dict            versions, device name, thread counts
  ops: linear, relu, matmul, exp, sum, square   the primitives the workloads are written with

`manual` is the workload's explicit numpy backprop: numpy, which has no autodiff, uses it; the
autodiff backends ignore it.
"""

from __future__ import annotations

import importlib
import sys
from types import ModuleType

from runner.config import nvidia_driver_present

BACKENDS = ("numpy", "torch", "tensorflow", "tnp")


def load_backend(name: str) -> ModuleType:
    """Import the module of one backend (and with it, its framework)."""
    if name not in BACKENDS:
        raise ValueError(f"unknown backend {name!r} (allowed: {', '.join(BACKENDS)})")
    if {"torch", "tensorflow"} & set(sys.modules) and "triton" not in sys.modules and not nvidia_driver_present():
        # One process running both frameworks (isolation=inline): triton, torch's GPU kernel compiler, then
        # segfaults when it loads after TensorFlow. Without a GPU torch never needs it, so hide it.
        sys.modules["triton"] = None
    return importlib.import_module(f"runner.backends.{name}_backend")

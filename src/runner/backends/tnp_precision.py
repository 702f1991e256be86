"""Half precision that stays half on tf.experimental.numpy.

Two of tnp's rules would compute a float16 or bfloat16 model partly in float32 (the record would then claim a
half-precision run with a float32 run's error):
- its legacy type promotion makes a Python float a float32 array, so `x * 0.5` on a half-precision `x` comes out
  float32. NumPy's own rule since 2.0 (NEP 50, tnp's `dtype_conversion_mode="all"`) keeps `x`'s dtype;
- its float functions (exp, sqrt, tanh, ...) cast what NumPy does not call inexact to float32 first, and NumPy does
  not call ml_dtypes' bfloat16 inexact. On a float array they call TensorFlow's kernel on it unchanged, so these do
  the same for bfloat16.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import tensorflow as tf

tnp = tf.experimental.numpy


def enable_numpy_behavior() -> None:
    """A process-wide switch in TF: set for each tnp job, as a TensorFlow job sets TF's own rules back."""
    tnp.experimental_enable_numpy_behavior(prefer_float32=True, dtype_conversion_mode="all")


def tensorflow_rules() -> None:
    """TensorFlow's own dtype rules (no implicit promotion), where a tnp job earlier in this process (isolation=inline,
    the tests) switched them to NumPy's: Keras's variables cannot be compared under those, and a training step would
    fail. TF has no public switch back."""
    from tensorflow.python.framework import ops

    ops.set_dtype_conversion_mode("off")


def _float_kept(numpy_fn: Callable, kernel: Callable) -> Callable:
    """numpy_fn, with bfloat16 handed to the TensorFlow kernel it calls for every other float dtype."""

    @functools.wraps(numpy_fn)
    def fn(x):
        return kernel(x) if getattr(x, "dtype", None) == tf.bfloat16 else numpy_fn(x)

    return fn


exp = _float_kept(tnp.exp, tf.math.exp)
sqrt = _float_kept(tnp.sqrt, tf.math.sqrt)
tanh = _float_kept(tnp.tanh, tf.math.tanh)

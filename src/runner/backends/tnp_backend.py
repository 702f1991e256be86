"""tf.experimental.numpy backend: TensorFlow's machinery with NumPy-style ops and type promotion.

Everything but the ops and `prepare` is the tensorflow backend's: tnp arrays are tf.Tensors.
"""

from __future__ import annotations

from runner.backends import tensorflow_backend as tf_backend
from runner.backends.tensorflow_backend import (  # noqa: F401 - re-exported: the backend function set
    DTYPES,
    adaptive_avg_pool2d,
    asarray,
    batch_jacobian,
    batch_norm,
    compile_model,
    compile_step,
    conv2d,
    conv_transpose2d,
    convert,
    data_pointer,
    environment,
    flatten,
    from_native_layout,
    from_nchw,
    grad,
    instance_norm,
    max_pool2d,
    peak_device_mb,
    per_example_grad,
    reflection_pad2d,
    reset_peak_memory,
    reshape,
    set_threads,
    synchronizer,
    tanh,
    to_native_layout,
    to_nchw,
    to_numpy,
    trainable,
)

tnp = tf_backend.tf.experimental.numpy  # imported through the tensorflow backend, which quiets TF's logs

_numpy_behavior_enabled = False


def prepare(device: str, dtype: str) -> str:
    global _numpy_behavior_enabled
    if not _numpy_behavior_enabled:  # process-wide switch in TF: flip it once
        tnp.experimental_enable_numpy_behavior(prefer_float32=True)
        _numpy_behavior_enabled = True
    return tf_backend.prepare(device, dtype)


# -- ops: written with tnp, as the TF-NumPy guide writes its model ----------------------------------------


def linear(x, weight, bias=None):
    y = tnp.matmul(x, weight)  # weight held as (in, out), as the TF-NumPy guide writes it
    return y if bias is None else y + bias


def relu(x):
    return tnp.maximum(x, 0)


matmul = tnp.matmul
exp = tnp.exp
square = tnp.square
sum = tnp.sum  # noqa: A001 - the ops namespace mirrors the frameworks' names

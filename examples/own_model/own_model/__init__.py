"""A user's own workload, outside the runner's source: a small convolutional network.

It is written against the `dense` op family only (linear, relu, matmul, sum, square), which numpy, torch,
tensorflow and tnp all provide, so it runs on all four. The convolution is a matmul over image patches
extracted once in numpy (im2col, in `make_inputs`), so no backend needs a convolution op:

    x      (batch, positions, channels * kernel * kernel)   the patches of each image
    conv   relu(x @ conv.weight.T + conv.bias)              (batch, positions, filters): a valid convolution
    pool   pool.weight @ conv                               (batch, 1, filters): learned weights over positions
    fc     pool @ fc.weight.T + fc.bias                     (batch, 1, classes)

2-D weights are (out, in), as torch's nn.Linear holds them: each backend converts that layout once to
its own (TensorFlow: (in, out)); `pool.weight` is 3-D, (1, 1, positions), and is left as it is. The
explicit float64 numpy backward below is numpy's gradient and the reference every backend is checked
against (`max_rel_err_vs_reference`).

Run it (from anywhere, with this folder's path as OWN):

    PYTHONPATH=OWN python run.py hydra.searchpath=[file://OWN/conf] model=small_convnet backend=torch
"""

from __future__ import annotations

import numpy as np

from runner.models import Workload

Params = dict[str, np.ndarray]


def im2col(images: np.ndarray, kernel: int) -> np.ndarray:
    """(batch, channels, H, W) -> (batch, positions, channels * kernel * kernel), a valid convolution's patches
    in the order of torch's conv weight (channel, row, column)."""
    windows = np.lib.stride_tricks.sliding_window_view(images, (kernel, kernel), axis=(2, 3))
    batch, channels, rows, cols = windows.shape[:4]
    return windows.transpose(0, 2, 3, 1, 4, 5).reshape(batch, rows * cols, channels * kernel * kernel)


class SmallConvNet(Workload):
    """conv (kernel x kernel, valid) -> relu -> learned pooling over positions -> linear, loss = sum of squares."""

    name = "small_convnet"
    jacobian = None  # this example defines gradients only

    def __init__(self, image_size: int = 16, channels: int = 3, filters: int = 8, kernel: int = 3, classes: int = 10):
        if image_size < kernel:
            raise ValueError(f"image_size={image_size} is smaller than the kernel ({kernel})")
        self.image_size, self.channels, self.filters, self.kernel, self.classes = (
            image_size,
            channels,
            filters,
            kernel,
            classes,
        )
        self.positions = (image_size - kernel + 1) ** 2
        self.patch = channels * kernel * kernel

    def init_params(self, rng: np.random.Generator) -> Params:
        return {
            "conv.weight": rng.standard_normal((self.filters, self.patch)) * np.sqrt(2.0 / self.patch),
            "conv.bias": rng.standard_normal(self.filters) * 0.1,
            "pool.weight": (1.0 + 0.1 * rng.standard_normal((1, 1, self.positions))) / self.positions,
            "fc.weight": rng.standard_normal((self.classes, self.filters)) / np.sqrt(self.filters),
            "fc.bias": rng.standard_normal(self.classes) * 0.1,
        }

    def make_inputs(self, rng: np.random.Generator, batch_size: int) -> dict[str, np.ndarray]:
        images = rng.standard_normal((batch_size, self.channels, self.image_size, self.image_size))
        labels = rng.standard_normal((batch_size, 1, self.classes))
        return {"x": im2col(images, self.kernel), "labels": labels}

    def examples_per_call(self, batch_size: int) -> int:
        return batch_size

    # -- written once against the backend ops ------------------------------------------------------

    def forward(self, ops, params: dict, x):
        features = ops.relu(ops.linear(x, params["conv.weight"], params["conv.bias"]))
        pooled = ops.matmul(params["pool.weight"], features)
        return ops.linear(pooled, params["fc.weight"], params["fc.bias"])

    def loss(self, ops, params: dict, x, labels):
        return ops.sum(ops.square(self.forward(ops, params, x) - labels))

    # -- the float64 numpy backward: numpy's gradients and every backend's reference -----------------

    def per_example_gradients(self, params: Params, x: np.ndarray, labels: np.ndarray) -> Params:
        pre = x @ params["conv.weight"].T + params["conv.bias"]  # (batch, positions, filters)
        features = np.maximum(pre, 0)
        pooled = params["pool.weight"] @ features  # (batch, 1, filters)
        y = pooled @ params["fc.weight"].T + params["fc.bias"]  # (batch, 1, classes)
        d_y = 2 * (y - labels)
        d_pooled = d_y @ params["fc.weight"]  # (batch, 1, filters)
        d_pre = params["pool.weight"][0, 0][None, :, None] * d_pooled * (pre > 0)  # (batch, positions, filters)
        return {
            "conv.weight": np.einsum("bpf,bpk->bfk", d_pre, x),
            "conv.bias": d_pre.sum(axis=1),
            "pool.weight": np.einsum("bif,bpf->bip", d_pooled, features)[:, None],
            "fc.weight": np.einsum("bio,bif->bof", d_y, pooled),
            "fc.bias": d_y[:, 0],
        }

    def gradients(self, params: Params, x: np.ndarray, labels: np.ndarray) -> Params:
        return {name: g.sum(axis=0) for name, g in self.per_example_gradients(params, x, labels).items()}

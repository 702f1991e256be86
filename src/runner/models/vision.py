"""torchvision's AlexNet and ResNets and seed 004's CycleGAN generator, written once against backend ops.

Parameters carry torchvision's state-dict names and shapes, so torchvision checkpoints load directly
and gradients from every backend compare by name. Batch-norm running statistics are constants, not
trained: `trainable(name)` tells them apart. Images enter and leave as NCHW; each backend computes in
its own layout (`ops.from_nchw` / `ops.to_nchw`).
"""

from __future__ import annotations

from functools import cache
from pathlib import Path

import numpy as np

from runner.config import ConfigError
from runner.models import ForwardSize, Workload
from runner.models.architectures import (
    BN_STATS,
    N_CLASSES,
    RESNET_LAYERS,
    alexnet_forward,
    alexnet_spec,
    cyclegan_forward,
    cyclegan_spec,
    resnet_forward,
    resnet_spec,
)

# -- sizes: the forward passes walked on shapes alone ------------------------------------------


class InputTooSmall(ValueError):
    """A layer would get an input it cannot take."""


class _Shape:
    """An NCHW shape standing in for a tensor: the forward passes run on it as on a backend's arrays."""

    def __init__(self, *dims: int):
        self.shape = tuple(int(d) for d in dims)

    def __add__(self, other: _Shape) -> _Shape:
        if other.shape != self.shape:
            raise InputTooSmall(f"a residual sum of {self.shape} and {other.shape}")
        return self

    def __getitem__(self, index: tuple) -> _Shape:
        return _Shape(*(len(range(*i.indices(d))) for i, d in zip(index, self.shape, strict=False)))


def _spatial(x: _Shape, out_h: int, out_w: int, what: str) -> _Shape:
    if out_h < 1 or out_w < 1:
        raise InputTooSmall(f"{what} of a {x.shape[2]}x{x.shape[3]} input")
    return _Shape(x.shape[0], x.shape[1], out_h, out_w)


class ShapeOps:
    """The ops the forward passes use, computing output shapes and refusing what torch would refuse."""

    @staticmethod
    def conv2d(x: _Shape, weight: tuple, bias=None, stride: int = 1, padding: int = 0) -> _Shape:
        n, _, h, w = x.shape
        k = weight[2]
        y = _spatial(x, (h + 2 * padding - k) // stride + 1, (w + 2 * padding - k) // stride + 1, f"a {k}x{k} conv")
        return _Shape(n, weight[0], *y.shape[2:])

    @staticmethod
    def conv_transpose2d(x: _Shape, weight: tuple, bias=None, stride=1, padding=0, output_padding=0) -> _Shape:
        n, _, h, w = x.shape
        k = weight[2]
        return _Shape(
            n,
            weight[1],
            (h - 1) * stride - 2 * padding + k + output_padding,
            (w - 1) * stride - 2 * padding + k + output_padding,
        )

    @staticmethod
    def max_pool2d(x: _Shape, kernel: int, stride: int, padding: int = 0) -> _Shape:
        h, w = x.shape[2:]
        return _spatial(
            x,
            (h + 2 * padding - kernel) // stride + 1,
            (w + 2 * padding - kernel) // stride + 1,
            f"a {kernel}x{kernel} max-pool",
        )

    @staticmethod
    def reflection_pad2d(x: _Shape, pad: int) -> _Shape:
        h, w = x.shape[2:]
        if pad >= h or pad >= w:  # reflection needs more pixels than it mirrors
            raise InputTooSmall(f"reflection padding {pad} of a {h}x{w} input")
        return _Shape(*x.shape[:2], h + 2 * pad, w + 2 * pad)

    @staticmethod
    def instance_norm(x: _Shape) -> _Shape:
        if x.shape[2] * x.shape[3] < 2:  # torch refuses statistics of one pixel
            raise InputTooSmall("instance norm of a 1x1 input")
        return x

    @staticmethod
    def adaptive_avg_pool2d(x: _Shape, size: tuple) -> _Shape:
        return _Shape(*x.shape[:2], *size)

    @staticmethod
    def flatten(x: _Shape) -> _Shape:
        return _Shape(x.shape[0], int(np.prod(x.shape[1:])))

    @staticmethod
    def linear(x: _Shape, weight: tuple, bias=None) -> _Shape:
        return _Shape(x.shape[0], weight[0])

    @staticmethod
    def batch_norm(x: _Shape, *args) -> _Shape:
        return x

    relu = tanh = from_nchw = to_nchw = staticmethod(lambda x: x)


# -- the workload ------------------------------------------------------------------------------


class VisionModel(Workload):
    """A convnet workload: seeded (or loaded) torchvision-named weights, images in, logits or images out."""

    numpy_reference = False  # numpy has no convolutions: agreement is checked across backends instead
    gradients = per_example_gradients = jacobian = None  # no explicit numpy backprop
    spec: dict[str, tuple]  # always: set in __init__

    def __init__(self, arch: str, image_size: int):
        self.name, self.image_size = arch, image_size
        self.makes_images = arch == "cyclegan"
        if arch in RESNET_LAYERS:
            self.spec, self._forward = resnet_spec(arch), lambda ops, p, x: resnet_forward(arch, ops, p, x)
        elif arch == "alexnet":
            self.spec, self._forward = alexnet_spec(), alexnet_forward
        else:
            self.spec, self._forward = cyclegan_spec(), cyclegan_forward
        self.check_input_size(image_size, image_size, f"data.image_size={image_size}")

    def output_shape(self, input_shape: tuple) -> tuple:
        """The output's shape for an NCHW input shape; InputTooSmall where a layer cannot take it."""
        return self._forward(ShapeOps, self.spec, _Shape(*input_shape)).shape

    def check_images(self, x: np.ndarray, source: str) -> None:
        """ConfigError (one line) for NCHW images from `source` that this network cannot take."""
        height, width = x.shape[2:]
        self.check_input_size(height, width, f"the {height}x{width} images from {source}")
        if not self.makes_images:
            return
        for index, image in enumerate(x):
            if np.ptp(image, axis=(1, 2)).max() == 0:
                which = f"image {index} of {source}" if len(x) > 1 else str(source)
                raise ConfigError(
                    f"{which} is one colour: CycleGAN's instance norm would divide by its zero variance, "
                    "so the output would be rounding noise"
                )

    def check_input_size(self, height: int, width: int, what: str) -> None:
        """ConfigError (one line, with the smallest size that works) for images the network cannot take."""
        try:
            self.output_shape((1, 3, height, width))
        except InputTooSmall as error:
            smallest = min_image_size(self.name)
            raise ConfigError(
                f"{what} is too small for model={self.name} ({error}): the smallest size it takes is "
                f"{smallest}x{smallest}"
            ) from None

    def init_params(self, rng: np.random.Generator) -> dict[str, np.ndarray]:
        """He-initialised convolutions and linears; batch norm with mild, non-trivial statistics."""
        params = {}
        for name, shape in self.spec.items():
            fan_in = int(np.prod(shape[1:])) if len(shape) > 1 else 1
            if name.endswith(".weight") and len(shape) > 1:
                params[name] = rng.standard_normal(shape) * np.sqrt(2.0 / fan_in)
            elif name.endswith("running_var"):
                params[name] = rng.uniform(0.5, 1.5, shape)
            elif name.endswith(("running_mean", ".bias")):
                params[name] = rng.standard_normal(shape) * 0.1
            else:  # batch-norm scale: small, so the eval-mode residual stream stays bounded
                params[name] = rng.uniform(0.2, 0.5, shape)
        return params

    def trainable(self, name: str) -> bool:
        return not name.endswith(BN_STATS)

    def make_inputs(self, rng: np.random.Generator, batch_size: int) -> dict[str, np.ndarray]:
        x = rng.standard_normal((batch_size, 3, self.image_size, self.image_size))
        return {"x": x, "labels": self.make_labels(rng, x)}

    def make_labels(self, rng: np.random.Generator, x: np.ndarray) -> np.ndarray:
        """Seeded targets for the loss, shaped like the outputs (images for CycleGAN, logits otherwise)."""
        return rng.standard_normal(self.output_shape(x.shape)) * 0.1

    def examples_per_call(self, batch_size: int) -> int:
        return batch_size

    def forward_size(self, batch_size: int) -> ForwardSize:
        """Weights, images and labels, outputs; not the activations, which depend on the framework."""
        image = 3 * self.image_size**2
        output = image if self.makes_images else N_CLASSES
        return ForwardSize(
            weights=sum(int(np.prod(shape)) for shape in self.spec.values()),
            inputs=batch_size * (image + output),
            outputs=batch_size * output,
            examples=batch_size,
            x_per_example=image,
        )

    def forward(self, ops, params: dict, x):
        return self._forward(ops, params, x)

    def loss(self, ops, params: dict, x, labels):
        """The same loss on every backend: sum of squared error against seeded targets."""
        return ops.sum(ops.square(self.forward(ops, params, x) - labels))

    def interpret(self, y: np.ndarray) -> dict:
        """CycleGAN: the images (NCHW, in [-1, 1]); classifiers: the top-5 ImageNet classes per example."""
        return {"images": y} if self.makes_images else {"predictions": top5(y)}


def top5(logits: np.ndarray) -> list[list[dict]]:
    """Softmax probabilities of the five most likely ImageNet classes, per example."""
    shifted = logits.astype(np.float64) - logits.max(axis=1, keepdims=True)
    probabilities = np.exp(shifted) / np.exp(shifted).sum(axis=1, keepdims=True)
    names = imagenet_classes()
    return [
        [{"label": names[i], "probability": float(row[i])} for i in np.argsort(row)[::-1][:5]] for row in probabilities
    ]


@cache
def min_image_size(name: str, limit: int = 4096) -> int:
    """The smallest square input side that every layer of `name` can take, found by walking the forward
    pass on shapes (AlexNet: 63, its third max-pool needs 3x3; ResNets: 1; CycleGAN: 5)."""
    model = VisionModel(name, limit)
    for size in range(1, limit):
        try:
            model.output_shape((1, 3, size, size))
            return size
        except InputTooSmall:
            continue
    raise ValueError(f"model {name} takes no image up to {limit}x{limit}")


@cache
def imagenet_classes() -> list[str]:
    """The 1000 ImageNet class names, in torchvision's order (shipped, so no framework is needed)."""
    return (Path(__file__).with_name("imagenet_classes.txt")).read_text().splitlines()

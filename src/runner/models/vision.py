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
from runner.models import Workload

RESNET_LAYERS = {
    "resnet18": ("basic", (2, 2, 2, 2)),
    "resnet50": ("bottleneck", (3, 4, 6, 3)),
    "resnet101": ("bottleneck", (3, 4, 23, 3)),
}
BN_STATS = ("running_mean", "running_var")
N_CLASSES = 1000


# -- parameter specs: {torch state-dict name: shape} ----------------------------------------------


def _conv(spec: dict, name: str, c_out: int, c_in: int, k: int, bias: bool = False) -> None:
    spec[f"{name}.weight"] = (c_out, c_in, k, k)
    if bias:
        spec[f"{name}.bias"] = (c_out,)


def _bn(spec: dict, name: str, c: int) -> None:
    for part in ("weight", "bias", *BN_STATS):
        spec[f"{name}.{part}"] = (c,)


def resnet_spec(arch: str) -> dict[str, tuple]:
    kind, layers = RESNET_LAYERS[arch]
    expansion = 1 if kind == "basic" else 4
    spec: dict[str, tuple] = {}
    _conv(spec, "conv1", 64, 3, 7)
    _bn(spec, "bn1", 64)
    inplanes = 64
    for layer, (blocks, planes) in enumerate(zip(layers, (64, 128, 256, 512), strict=True), start=1):
        for block in range(blocks):
            prefix = f"layer{layer}.{block}"
            stride = 2 if layer > 1 and block == 0 else 1
            if kind == "basic":
                _conv(spec, f"{prefix}.conv1", planes, inplanes, 3)
                _bn(spec, f"{prefix}.bn1", planes)
                _conv(spec, f"{prefix}.conv2", planes, planes, 3)
                _bn(spec, f"{prefix}.bn2", planes)
            else:
                _conv(spec, f"{prefix}.conv1", planes, inplanes, 1)
                _bn(spec, f"{prefix}.bn1", planes)
                _conv(spec, f"{prefix}.conv2", planes, planes, 3)
                _bn(spec, f"{prefix}.bn2", planes)
                _conv(spec, f"{prefix}.conv3", planes * 4, planes, 1)
                _bn(spec, f"{prefix}.bn3", planes * 4)
            if stride != 1 or inplanes != planes * expansion:
                _conv(spec, f"{prefix}.downsample.0", planes * expansion, inplanes, 1)
                _bn(spec, f"{prefix}.downsample.1", planes * expansion)
            inplanes = planes * expansion
    spec["fc.weight"] = (N_CLASSES, 512 * expansion)
    spec["fc.bias"] = (N_CLASSES,)
    return spec


ALEXNET_CONVS = (
    (0, 64, 3, 11, 4, 2),
    (3, 192, 64, 5, 1, 2),
    (6, 384, 192, 3, 1, 1),
    (8, 256, 384, 3, 1, 1),
    (10, 256, 256, 3, 1, 1),
)  # (index in features, out, in, kernel, stride, padding)
ALEXNET_POOL_AFTER = {0, 3, 10}


def alexnet_spec() -> dict[str, tuple]:
    spec: dict[str, tuple] = {}
    for index, c_out, c_in, k, _, _ in ALEXNET_CONVS:
        _conv(spec, f"features.{index}", c_out, c_in, k, bias=True)
    for index, n_out, n_in in ((1, 4096, 256 * 6 * 6), (4, 4096, 4096), (6, N_CLASSES, 4096)):
        spec[f"classifier.{index}.weight"] = (n_out, n_in)
        spec[f"classifier.{index}.bias"] = (n_out,)
    return spec


CYCLEGAN_BLOCKS = range(10, 19)  # model.10 ... model.18 are the 9 residual blocks


def cyclegan_spec(ngf: int = 64) -> dict[str, tuple]:
    spec: dict[str, tuple] = {}
    _conv(spec, "model.1", ngf, 3, 7, bias=True)
    _conv(spec, "model.4", ngf * 2, ngf, 3, bias=True)
    _conv(spec, "model.7", ngf * 4, ngf * 2, 3, bias=True)
    for block in CYCLEGAN_BLOCKS:
        for conv in (1, 5):
            _conv(spec, f"model.{block}.conv_block.{conv}", ngf * 4, ngf * 4, 3, bias=True)
    for index, c_in in ((19, ngf * 4), (22, ngf * 2)):  # ConvTranspose2d weights are (in, out, k, k)
        spec[f"model.{index}.weight"] = (c_in, c_in // 2, 3, 3)
        spec[f"model.{index}.bias"] = (c_in // 2,)
    _conv(spec, "model.26", 3, ngf, 7, bias=True)
    return spec


# -- forward passes ----------------------------------------------------------------------------


def _bn_apply(ops, p: dict, name: str, x):
    return ops.batch_norm(
        x, p[f"{name}.running_mean"], p[f"{name}.running_var"], p[f"{name}.weight"], p[f"{name}.bias"]
    )


def resnet_forward(arch: str, ops, p: dict, x):
    kind, layers = RESNET_LAYERS[arch]
    x = ops.from_nchw(x)
    x = ops.relu(_bn_apply(ops, p, "bn1", ops.conv2d(x, p["conv1.weight"], stride=2, padding=3)))
    x = ops.max_pool2d(x, 3, 2, 1)
    for layer, blocks in enumerate(layers, start=1):
        for block in range(blocks):
            stride = 2 if layer > 1 and block == 0 else 1
            x = _resnet_block(kind, ops, p, f"layer{layer}.{block}", x, stride)
    x = ops.flatten(ops.adaptive_avg_pool2d(x, (1, 1)))
    return ops.linear(x, p["fc.weight"], p["fc.bias"])


def _resnet_block(kind: str, ops, p: dict, prefix: str, x, stride: int):
    identity = x
    if kind == "basic":
        out = ops.relu(_bn_apply(ops, p, f"{prefix}.bn1", ops.conv2d(x, p[f"{prefix}.conv1.weight"], None, stride, 1)))
        out = _bn_apply(ops, p, f"{prefix}.bn2", ops.conv2d(out, p[f"{prefix}.conv2.weight"], None, 1, 1))
    else:
        out = ops.relu(_bn_apply(ops, p, f"{prefix}.bn1", ops.conv2d(x, p[f"{prefix}.conv1.weight"])))
        out = ops.relu(
            _bn_apply(ops, p, f"{prefix}.bn2", ops.conv2d(out, p[f"{prefix}.conv2.weight"], None, stride, 1))
        )
        out = _bn_apply(ops, p, f"{prefix}.bn3", ops.conv2d(out, p[f"{prefix}.conv3.weight"]))
    if f"{prefix}.downsample.0.weight" in p:
        identity = ops.conv2d(x, p[f"{prefix}.downsample.0.weight"], None, stride, 0)
        identity = _bn_apply(ops, p, f"{prefix}.downsample.1", identity)
    return ops.relu(out + identity)


def alexnet_forward(ops, p: dict, x):
    x = ops.from_nchw(x)
    for index, _, _, _, stride, padding in ALEXNET_CONVS:
        x = ops.relu(ops.conv2d(x, p[f"features.{index}.weight"], p[f"features.{index}.bias"], stride, padding))
        if index in ALEXNET_POOL_AFTER:
            x = ops.max_pool2d(x, 3, 2)
    x = ops.flatten(ops.adaptive_avg_pool2d(x, (6, 6)))
    for index in (1, 4):  # dropout is the identity in inference
        x = ops.relu(ops.linear(x, p[f"classifier.{index}.weight"], p[f"classifier.{index}.bias"]))
    return ops.linear(x, p["classifier.6.weight"], p["classifier.6.bias"])


def cyclegan_forward(ops, p: dict, x):
    """Seed 004's generator on any image size: the input is reflection-padded at the bottom and right to a
    multiple of 4 (its two stride-2 convolutions and two transposed ones return a multiple of 4: 344 rows
    for 341) and the output cropped back, so the image out is the size of the image in, on every backend.
    Sizes that are multiples of 4 (256 x 256) are untouched."""

    def conv(x, index, stride=1, padding=0):
        return ops.conv2d(x, p[f"{index}.weight"], p[f"{index}.bias"], stride, padding)

    height, width = x.shape[2], x.shape[3]
    x = _pad_to_multiple(ops, x, height, width, 4)
    x = ops.relu(ops.instance_norm(conv(ops.reflection_pad2d(x, 3), "model.1")))
    x = ops.relu(ops.instance_norm(conv(x, "model.4", 2, 1)))
    x = ops.relu(ops.instance_norm(conv(x, "model.7", 2, 1)))
    for block in CYCLEGAN_BLOCKS:
        name = f"model.{block}.conv_block"
        y = ops.relu(ops.instance_norm(conv(ops.reflection_pad2d(x, 1), f"{name}.1")))
        x = x + ops.instance_norm(conv(ops.reflection_pad2d(y, 1), f"{name}.5"))
    for index in (19, 22):
        x = ops.conv_transpose2d(x, p[f"model.{index}.weight"], p[f"model.{index}.bias"], 2, 1, 1)
        x = ops.relu(ops.instance_norm(x))
    x = ops.tanh(conv(ops.reflection_pad2d(x, 3), "model.26"))
    return ops.to_nchw(x)[:, :, :height, :width]


def _pad_to_multiple(ops, x, height: int, width: int, multiple: int):
    """NCHW x -> the backend's layout, reflection-padded at the bottom and right to a multiple of `multiple`.
    Backends pad all four sides alike, so this pads all sides and slices (in NCHW) what is kept."""
    extra_h, extra_w = -height % multiple, -width % multiple
    pad = max(extra_h, extra_w)
    x = ops.from_nchw(x)
    if not pad:
        return x
    padded = ops.to_nchw(ops.reflection_pad2d(x, pad))
    return ops.from_nchw(padded[:, :, pad : pad + height + extra_h, pad : pad + width + extra_w])


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

    def array_elements(self, batch_size: int, task: str, per_example: bool) -> dict[str, int]:
        """Weights, images and labels, results; not the activations, which depend on the framework."""
        weights = sum(int(np.prod(shape)) for shape in self.spec.values())
        image = 3 * self.image_size**2
        output = image if self.makes_images else N_CLASSES
        results = batch_size * output if task == "inference" else weights * (batch_size if per_example else 1)
        return {"weights": weights, "inputs": batch_size * (image + output), "results": results}

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

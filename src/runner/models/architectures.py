"""torchvision's AlexNet and ResNets and seed 004's CycleGAN generator, written once against the backend
ops: each network's weight names and shapes (torch's state dict) and its forward pass."""

from __future__ import annotations

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

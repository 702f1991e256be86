"""Model inputs: seeded random tensors, or real images (files, TFRecord, HDF5) with seed 004's preprocessing.

Images become float64 NCHW arrays in numpy (PIL does the resizing), so every backend gets the same
numbers and no framework is imported to prepare them (TFRecord parsing aside, which needs TensorFlow).
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from runner.config import ConfigError
from runner.models import Workload

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp", ".gif", ".webp", ".tif", ".tiff")
IMAGENET_MEAN = np.array([0.485, 0.456, 0.406])
IMAGENET_STD = np.array([0.229, 0.224, 0.225])
# What PIL's decoders raise for truncated or corrupt files (a broken PNG is a SyntaxError, bad zlib data a
# zlib.error): each means "this file is not a readable image".
DECODE_ERRORS = (OSError, SyntaxError, ValueError, EOFError, zlib.error, struct.error)


def check_source(data: Mapping[str, Any], workload: Workload) -> None:
    """Whether the configured data can feed this workload (ConfigError, one line): files of images need an image model
    and a path. Reads no file: preflight checks it before anything runs."""
    source = str(data["name"])  # a name: runner.config.DataSource, a StrEnum, or its str
    if source == "random":
        return
    if type(workload).make_labels is Workload.make_labels:
        raise ConfigError(f"data={source} feeds images: it needs an image model (alexnet, resnet*, cyclegan)")
    if not data.get("path"):
        raise ConfigError(f"data={source} needs data.path=FILE")


def load_inputs(data: Mapping[str, Any], workload, rng: np.random.Generator, batch_size: int) -> dict[str, np.ndarray]:
    """{"x": ..., "labels": ...} for the configured data source (at most batch_size examples from files)."""
    check_source(data, workload)
    source = str(data["name"])
    if source == "random":
        return workload.make_inputs(rng, batch_size)
    path = str(data["path"])  # check_source: files need one
    crop = not workload.makes_images  # classifiers: resize 256 + centre crop 224; CycleGAN: resize 256
    prepare = workload.preprocess or (lambda image: preprocess(image, crop))  # a model's own
    if source == "image":
        images = [prepare(open_image(file)) for file in image_files(Path(path))[:batch_size]]
    elif source == "tfrecord":
        images = [prepare(image) for image in read_tfrecord(Path(path), batch_size)]
    else:
        x = read_hdf5(Path(path), data["dataset"], batch_size, crop)
        return _with_labels(workload, rng, x, path)
    return _with_labels(workload, rng, _stack(images, path), path)


def place_input(backend: Any, array: np.ndarray, device: str, dtype: str) -> Any:
    """An input on the device: in the run's dtype, or as token ids where it holds integers (model=gpt2)."""
    if np.issubdtype(array.dtype, np.integer):
        return backend.token_ids(array, device)
    return backend.asarray(array, device, dtype)


def _with_labels(workload, rng: np.random.Generator, x: np.ndarray, source: str) -> dict[str, np.ndarray]:
    workload.check_images(x, source)  # before any timed call: images the network cannot take
    return {"x": x, "labels": workload.make_labels(rng, x)}


def _stack(images: list[np.ndarray], source: str) -> np.ndarray:
    if not images:
        raise ConfigError(f"no images found in {source}")
    if len({image.shape for image in images}) > 1:
        raise ConfigError(
            f"images in {source} differ in size after preprocessing: use one image or equal aspect ratios"
        )
    return np.stack(images)


def image_files(path: Path) -> list[Path]:
    """The image file at `path`, or the image files in that folder; only regular files, since reading a
    FIFO or a device named like an image would block or never end."""
    if path.is_file():
        return [path]
    if path.exists() and not path.is_dir():
        raise ConfigError(f"data.path={path} is not a regular file or a folder")
    if not path.is_dir():
        raise ConfigError(f"data.path not found: {path}")
    return sorted(p for p in path.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES and p.is_file())


def open_image(path: Path):
    """An RGB PIL image as a person sees the file: EXIF orientation applied, greyscale, palette, CMYK and
    16-bit files converted, alpha dropped (as torchvision's loaders do). One line naming the file if it
    cannot be decoded (truncated, corrupt, not an image)."""
    from PIL import Image, ImageOps

    try:
        with Image.open(path) as image:
            image.load()
            return _to_rgb(ImageOps.exif_transpose(image))
    except (*DECODE_ERRORS, Image.DecompressionBombError) as error:
        reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise ConfigError(f"cannot read image {path}: {reason}") from None


def _to_rgb(image):
    from PIL import Image

    if image.mode in ("I;16", "I;16B", "I;16L", "I;16N", "I"):
        # 16-bit greyscale (PNG; some Pillow versions open it as 32-bit "I"): scale 0..65535 to 0..255.
        # PIL's own conversion would clip every value above 255 to white.
        pixels = np.asarray(image, dtype=np.float64) / 257.0
        image = Image.fromarray(np.clip(np.round(pixels), 0, 255).astype(np.uint8), "L")
    elif image.mode == "P":  # a palette may carry transparency, which PIL converts through RGBA
        image = image.convert("RGBA")
    return image.convert("RGB")


def preprocess(image, crop: bool, resize: int = 256, crop_size: int = 224) -> np.ndarray:
    """torchvision's Resize(256) [+ CenterCrop(224) + Normalize(ImageNet)] + ToTensor, as in seed 004."""
    from PIL import Image

    width, height = image.size
    short, long = (width, height) if width <= height else (height, width)
    new_long = int(resize * long / short)
    size = (resize, new_long) if width <= height else (new_long, resize)
    image = image.resize(size, Image.Resampling.BILINEAR)
    if crop:
        left = int(round((image.size[0] - crop_size) / 2.0))
        top = int(round((image.size[1] - crop_size) / 2.0))
        image = image.crop((left, top, left + crop_size, top + crop_size))
    array = np.asarray(image, dtype=np.float64) / 255.0
    if crop:
        array = (array - IMAGENET_MEAN) / IMAGENET_STD
    return array.transpose(2, 0, 1)


def read_tfrecord(path: Path, limit: int) -> list:
    """Images from a TFRecord file of examples with encoded `image_raw` bytes and `height`/`width`."""
    if not path.is_file():
        raise ConfigError(f"data.path not found: {path}")
    import tensorflow as tf
    from PIL import Image

    features = {
        "image_raw": tf.io.FixedLenFeature([], tf.string),
        "height": tf.io.FixedLenFeature([], tf.int64),
        "width": tf.io.FixedLenFeature([], tf.int64),
    }
    images = []
    for record in tf.data.TFRecordDataset(str(path)).take(limit):
        example = tf.io.parse_single_example(record, features)
        pixels = tf.io.decode_image(example["image_raw"], channels=3).numpy()
        if pixels.shape[:2] != (example["height"].numpy(), example["width"].numpy()):
            raise ConfigError(f"{path}: an image's height/width features do not match its pixels")
        images.append(Image.fromarray(pixels))
    return images


def read_hdf5(path: Path, dataset: str, limit: int, crop: bool) -> np.ndarray:
    """A dataset of images: uint8 (N, H, W, 3) goes through the preprocessing, float (N, 3, H, W) as is."""
    import h5py
    from PIL import Image

    if not path.is_file():
        raise ConfigError(f"data.path not found: {path}")
    with h5py.File(path, "r") as f:
        if dataset not in f:
            raise ConfigError(f"{path} has no dataset {dataset!r} (has: {', '.join(f.keys())})")
        array = f[dataset][:limit]
    if array.dtype == np.uint8 and array.ndim == 4 and array.shape[-1] == 3:
        return np.stack([preprocess(Image.fromarray(image), crop) for image in array])
    if array.ndim == 4 and array.shape[1] == 3:
        return array.astype(np.float64)
    raise ConfigError(f"{path}:{dataset} has shape {array.shape}: expected uint8 (N, H, W, 3) or float (N, 3, H, W)")

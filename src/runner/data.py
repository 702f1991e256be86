"""Model inputs: seeded random tensors, or real images (files, TFRecord, HDF5) with seed 004's preprocessing.

Images become float64 NCHW arrays in numpy (PIL does the resizing), so every backend gets the same
numbers and no framework is imported to prepare them (TFRecord parsing aside, which needs TensorFlow).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from omegaconf import DictConfig

from runner.config import ConfigError

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp", ".gif", ".webp", ".tif", ".tiff")
IMAGENET_MEAN = np.array([0.485, 0.456, 0.406])
IMAGENET_STD = np.array([0.229, 0.224, 0.225])


def load_inputs(data_cfg: DictConfig, workload, rng: np.random.Generator, batch_size: int) -> dict[str, np.ndarray]:
    """{"x": ..., "labels": ...} for the configured data source (at most batch_size examples from files)."""
    source = str(getattr(data_cfg.name, "value", data_cfg.name))
    if source == "random":
        return workload.make_inputs(rng, batch_size)
    if not hasattr(workload, "make_labels"):
        raise ConfigError(f"data={source} feeds images: it needs an image model (alexnet, resnet*, cyclegan)")
    if not data_cfg.path:
        raise ConfigError(f"data={source} needs data.path=FILE")
    crop = not workload.makes_images  # classifiers: resize 256 + centre crop 224; CycleGAN: resize 256
    prepare = getattr(workload, "preprocess", None) or (lambda image: preprocess(image, crop))  # a model's own
    if source == "image":
        images = [prepare(_open(path)) for path in image_files(Path(data_cfg.path))[:batch_size]]
    elif source == "tfrecord":
        images = [prepare(image) for image in read_tfrecord(Path(data_cfg.path), batch_size)]
    else:
        return _with_labels(workload, rng, read_hdf5(Path(data_cfg.path), data_cfg.dataset, batch_size, crop))
    return _with_labels(workload, rng, _stack(images, data_cfg.path))


def _with_labels(workload, rng: np.random.Generator, x: np.ndarray) -> dict[str, np.ndarray]:
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
    if path.is_file():
        return [path]
    if not path.is_dir():
        raise ConfigError(f"data.path not found: {path}")
    return sorted(p for p in path.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES)


def _open(path: Path):
    from PIL import Image

    try:
        return Image.open(path).convert("RGB")
    except OSError as error:
        raise ConfigError(f"cannot read image {path}: {error}") from None


def preprocess(image, crop: bool) -> np.ndarray:
    """torchvision's Resize(256) [+ CenterCrop(224) + Normalize(ImageNet)] + ToTensor, as in seed 004."""
    from PIL import Image

    width, height = image.size
    short, long = (width, height) if width <= height else (height, width)
    new_long = int(256 * long / short)
    size = (256, new_long) if width <= height else (new_long, 256)
    image = image.resize(size, Image.BILINEAR)
    if crop:
        left, top = int(round((image.size[0] - 224) / 2.0)), int(round((image.size[1] - 224) / 2.0))
        image = image.crop((left, top, left + 224, top + 224))
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

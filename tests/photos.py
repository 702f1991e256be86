"""Photos as people have them, generated with PIL at test time (nothing shipped, nothing downloaded).

`make_photos(folder)` writes the set and returns {name: Photo}; `make_broken(folder)` writes files that
look like images and are not. Pictures are smooth seeded scenes (gradients and discs), so JPEG
compresses them as it compresses photographs.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image

EXIF_ORIENTATION = 0x0112  # 6: the camera was turned; viewers rotate the stored pixels 90 degrees clockwise


@dataclass(frozen=True)
class Photo:
    path: Path
    seen_size: tuple[int, int]  # (width, height) as a viewer shows it


def scene(width: int, height: int, seed: int = 0) -> np.ndarray:
    """A smooth RGB uint8 picture: a colour gradient with a few soft discs."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width] / max(width, height, 1)
    picture = np.stack([x, y, 1 - (x + y) / 2], axis=-1)
    for _ in range(4):
        cx, cy, r = rng.uniform(0, 1), rng.uniform(0, 1), rng.uniform(0.1, 0.3)
        disc = np.exp(-((x - cx * width / max(width, height)) ** 2 + (y - cy) ** 2) / r**2)
        picture += disc[..., None] * rng.uniform(-0.5, 0.5, 3)
    return (np.clip(picture, 0, 1) * 255).round().astype(np.uint8)


def make_photos(folder: Path) -> dict[str, Photo]:
    """4:3 and 16:9 JPEGs, odd sizes (333x251, 1x1), greyscale, RGBA, palette, CMYK JPEG, 16-bit PNG and
    a JPEG whose EXIF says it is rotated."""
    folder.mkdir(parents=True, exist_ok=True)
    photos: dict[str, Photo] = {}

    def save(name: str, image: Image.Image, seen: tuple[int, int] | None = None, **kwargs) -> None:
        image.save(folder / name, **kwargs)
        photos[name] = Photo(folder / name, seen or image.size)

    save("landscape_4x3.jpg", Image.fromarray(scene(400, 300, 1)), quality=90)
    save("wide_16x9.jpg", Image.fromarray(scene(480, 270, 2)), quality=90)
    save("odd_333x251.png", Image.fromarray(scene(333, 251, 3)))
    save("pixel_1x1.png", Image.fromarray(scene(1, 1, 4)))
    save("grey_L.png", Image.fromarray(scene(320, 240, 5)).convert("L"))
    rgba = Image.fromarray(scene(300, 300, 6)).convert("RGBA")
    rgba.putalpha(Image.fromarray(scene(300, 300, 7)[..., 0]))
    save("rgba.png", rgba)
    palette = Image.fromarray(scene(256, 192, 8)).quantize(64)
    save("palette_P.png", palette, transparency=0)
    save("cmyk.jpg", Image.fromarray(scene(300, 225, 9)).convert("CMYK"), quality=90)
    deep = (scene(320, 180, 10)[..., 1].astype(np.uint16) * 257) ^ np.uint16(0x5A)  # uses the low byte too
    save("deep_16bit.png", Image.fromarray(deep))  # uint16 -> mode I;16
    rotated = Image.fromarray(scene(400, 300, 11))
    exif = rotated.getexif()
    exif[EXIF_ORIENTATION] = 6
    save("exif_rotated.jpg", rotated, seen=(300, 400), exif=exif, quality=90)
    return photos


def make_broken(folder: Path) -> list[Path]:
    """A truncated JPEG, a truncated PNG, text named .jpg, and an empty .png."""
    folder.mkdir(parents=True, exist_ok=True)
    good = folder / "good.jpg"
    Image.fromarray(scene(200, 150)).save(good, quality=90)
    png = folder / "good.png"
    Image.fromarray(scene(200, 150)).save(png)
    broken = {
        "truncated.jpg": good.read_bytes()[: len(good.read_bytes()) // 2],
        "truncated.png": png.read_bytes()[: len(png.read_bytes()) // 2],
        "not_an_image.jpg": b"this is a text file that someone renamed\n",
        "empty.png": b"",
    }
    for name, content in broken.items():
        (folder / name).write_bytes(content)
    good.unlink()
    png.unlink()
    return [folder / name for name in broken]

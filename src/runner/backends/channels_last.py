"""Torch's layouts to the channels-last ones TensorFlow, Flax and the TF-NumPy guide compute with, and back
(numpy only: shared by the channels-last backends without importing either framework)."""

from __future__ import annotations

import numpy as np

# linear (out, in) -> (in, out); conv OIHW -> HWIO; transposed conv (in, out, kH, kW) -> (kH, kW, out, in)
_TO_CHANNELS_LAST = {2: (1, 0), 4: (2, 3, 1, 0)}


def to_native_layout(array: np.ndarray) -> np.ndarray:
    """A weight in torch's layout -> channels-last; vectors are unchanged."""
    return array.transpose(_TO_CHANNELS_LAST[array.ndim]) if array.ndim in _TO_CHANNELS_LAST else array


def from_native_layout(array: np.ndarray, per_example: bool = False) -> np.ndarray:
    """Back to torch's layouts; with per_example, a leading batch axis stays in front."""
    ndim = array.ndim - per_example
    if ndim not in _TO_CHANNELS_LAST:
        return array
    inverse = np.argsort(_TO_CHANNELS_LAST[ndim])
    return array.transpose((0, *(1 + inverse)) if per_example else inverse)


def adaptive_bins(size: int, bins: int) -> list[tuple[int, int]]:
    """torch's AdaptiveAvgPool bins: output bin i averages floor(i*size/bins) .. ceil((i+1)*size/bins)."""
    return [((i * size) // bins, -((-(i + 1) * size) // bins)) for i in range(bins)]

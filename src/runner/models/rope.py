"""Rotary position embeddings' inverse frequencies as Hugging Face's `modeling_rope_utils` computes them, in float64
NumPy: without scaling (`default`) and with each scaling model=llama computes, `model.rope_scaling` naming it by
`rope_type` (without one: Llama 3's four settings, as before rope types were named):

    llama3   wavelengths shorter than original / high_freq_factor kept, longer than original / low_freq_factor divided
             by `factor`, those between interpolated (Llama 3.1 / 3.2)
    linear   every frequency divided by `factor` (positions interpolated)
    dynamic  NTK-aware: the base grows once a sequence passes original_max_position_embeddings positions, and is the
             default's before; a run is refused where its sequence would pass them (`Llama.check_length`)
    yarn     frequencies between extrapolated and interpolated by a ramp over beta_fast .. beta_slow rotations, and
             cos / sin scaled by `attention_factor` (0.1 ln(factor) + 1 unless config.json sets it)
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from runner.config import ConfigError

LLAMA3 = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")
# rope_type -> (the settings it needs, those it may have with their defaults)
KINDS: dict[str, tuple[tuple[str, ...], dict[str, Any]]] = {
    "llama3": (LLAMA3, {}),
    "linear": (("factor",), {}),
    "dynamic": (("factor", "original_max_position_embeddings"), {}),
    "yarn": (
        ("factor", "original_max_position_embeddings"),
        {"beta_fast": 32.0, "beta_slow": 1.0, "attention_factor": None, "truncate": True},
    ),
}


def inverse_frequencies(head_size: int, theta: float, scaling: Mapping[str, Any] | None) -> np.ndarray:
    """The rotary embedding's (head_size / 2,) inverse frequencies in float64, `scaling` applied where set."""
    inv_freq = 1.0 / theta ** (np.arange(0, head_size, 2) / head_size)
    kind = None if scaling is None else scaling.get("rope_type", "llama3")
    if scaling is None or kind == "dynamic":  # dynamic: the default's within its original positions
        return inv_freq
    if kind == "linear":
        return inv_freq / scaling["factor"]
    if kind == "yarn":
        return yarn_scaled(inv_freq, head_size, theta, scaling)
    return llama3_scaled(inv_freq, **{k: scaling[k] for k in LLAMA3})


def llama3_scaled(
    inv_freq: np.ndarray,
    factor: float,
    low_freq_factor: float,
    high_freq_factor: float,
    original_max_position_embeddings: float,
) -> np.ndarray:
    """Llama 3's rope scaling (HF's `_compute_llama3_parameters`): wavelengths shorter than original / high_freq_factor
    are kept, those longer than original / low_freq_factor divided by `factor`, and those between interpolated."""
    wavelength = 2 * np.pi / inv_freq
    low_freq_wavelength = original_max_position_embeddings / low_freq_factor
    high_freq_wavelength = original_max_position_embeddings / high_freq_factor
    scaled = np.where(wavelength > low_freq_wavelength, inv_freq / factor, inv_freq)
    smooth = (original_max_position_embeddings / wavelength - low_freq_factor) / (high_freq_factor - low_freq_factor)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = (wavelength >= high_freq_wavelength) & (wavelength <= low_freq_wavelength)
    return np.where(medium, smoothed, scaled)


def yarn_scaled(inv_freq: np.ndarray, head_size: int, theta: float, scaling: Mapping[str, Any]) -> np.ndarray:
    """YaRN's frequencies (HF's `_compute_yarn_parameters`): the extrapolated (as they are) and interpolated (divided
    by `factor`) frequencies mixed by a linear ramp between the dimensions that turn beta_fast and beta_slow times
    over the original positions."""
    original = scaling["original_max_position_embeddings"]

    def dimension(rotations: float) -> float:
        return head_size * math.log(original / (rotations * 2 * math.pi)) / (2 * math.log(theta))

    low, high = dimension(scaling["beta_fast"]), dimension(scaling["beta_slow"])
    if scaling["truncate"]:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, head_size - 1)
    high = high + 0.001 if low == high else high  # HF's guard against a ramp of no width
    ramp = np.clip((np.arange(head_size // 2) - low) / (high - low), 0, 1)
    extrapolated = 1 - ramp
    return inv_freq / scaling["factor"] * (1 - extrapolated) + inv_freq * extrapolated


def attention_factor(scaling: Mapping[str, Any] | None) -> float:
    """What cos and sin are multiplied by: YaRN's attention factor, 1 for every other kind."""
    return 1.0 if scaling is None or scaling["rope_type"] != "yarn" else float(scaling["attention_factor"])


def yarn_attention_factor(factor: float, mscale: float | None = None, mscale_all_dim: float | None = None) -> float:
    """HF's default YaRN attention factor where config.json sets none: 0.1 ln(factor) + 1, or DeepSeek's ratio."""

    def scale(m: float = 1.0) -> float:
        return 1.0 if factor <= 1 else 0.1 * m * math.log(factor) + 1.0

    return scale(mscale) / scale(mscale_all_dim) if mscale and mscale_all_dim else scale()


def checked_rope_scaling(scaling: Any) -> dict[str, Any] | None:
    """model.rope_scaling: null, or a mapping naming its `rope_type` (llama3 where it names none) with that kind's
    settings; YaRN's attention factor is filled in where left null."""
    if scaling is None:
        return None
    if not isinstance(scaling, Mapping):
        raise ConfigError(f"model.rope_scaling={scaling!r} must be null or a mapping with a rope_type and its settings")
    kind = scaling.get("rope_type", scaling.get("type", "llama3"))
    if kind not in KINDS:
        raise ConfigError(
            f"model.rope_scaling.rope_type={kind}: the kinds computed are {', '.join(KINDS)} (or null: no scaling)"
        )
    needed, optional = KINDS[kind]
    given = {k: v for k, v in scaling.items() if k not in ("rope_type", "type")}
    if not set(needed) <= set(given) or not set(given) <= set(needed) | set(optional):
        allowed = ", ".join([*needed, *(f"[{k}]" for k in optional)])
        raise ConfigError(f"model.rope_scaling has {', '.join(sorted(given)) or 'none'}; {kind} takes {allowed}")
    checked: dict[str, Any] = {"rope_type": kind, **optional, **given}
    for key, value in checked.items():
        if key not in ("rope_type", "truncate", "attention_factor") and not _positive(value):
            raise ConfigError(f"model.rope_scaling.{key}={value!r}: must be a positive number")
    if kind == "llama3" and checked["high_freq_factor"] <= checked["low_freq_factor"]:
        raise ConfigError(
            f"model.rope_scaling.high_freq_factor={checked['high_freq_factor']} must be above low_freq_factor="
            f"{checked['low_freq_factor']}: the frequencies between them are interpolated"
        )
    if kind == "yarn" and checked["attention_factor"] is None:
        checked["attention_factor"] = yarn_attention_factor(float(checked["factor"]))
    return {k: v if k in ("rope_type", "truncate") else float(v) for k, v in checked.items()}


def _positive(value: Any) -> bool:
    return not isinstance(value, bool) and isinstance(value, int | float) and value > 0

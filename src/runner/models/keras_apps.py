"""Keras applications as the runner builds them on any Keras backend: Keras imported on a backend, a
`keras.applications` model built without weights (one line for an unknown architecture or an image size it cannot
take), and the runner's names of its variables. Used by the workload (runner.models.keras_model) and by its float64
reference's own process (runner.models.keras_reference)."""

from __future__ import annotations

import difflib
import os
import sys

from runner.config import ConfigError

DEFAULT_IMAGE_SIZE = 224
REFERENCE_BACKEND = "tensorflow"  # the Keras backend whose float64 is float64 throughout (keras_model.FLOAT32_INSIDE)


def import_keras(backend: str):
    """Keras 3 on `backend`; one line when this process already imported it with another backend."""
    if "keras" in sys.modules:
        loaded = sys.modules["keras"]
        if loaded.backend.backend() != backend:
            raise ConfigError(
                f"Keras is already running on {loaded.backend.backend()} in this process and cannot switch to "
                f"{backend}: run model=keras in a fresh process (isolation=process)"
            )
        return loaded
    os.environ["KERAS_BACKEND"] = backend
    import keras

    return keras


def variable_names(model) -> tuple[list[str], list[str]]:
    """The runner's names of a model's trainable and other variables: their paths, numbered where not unique."""
    variables = model.trainable_variables + model.non_trainable_variables
    names = [v.path for v in variables]
    if len(set(names)) != len(names):  # paths are unique in keras.applications; number them if not
        names = [f"{i}.{name}" for i, name in enumerate(names)]
    return names[: len(model.trainable_variables)], names[len(model.trainable_variables) :]


def applications(keras) -> list[str]:
    return sorted(name for name in dir(keras.applications) if name[:1].isupper())


def build_application(keras, arch: str, image_size: int):
    """keras.applications.<arch>, seedless (weights=None), logits out; one line for an unknown arch or size."""
    known = applications(keras)
    if arch not in known:
        lowered = {name.lower(): name for name in known}
        close = difflib.get_close_matches(arch.lower(), list(lowered), n=5, cutoff=0.4)
        hint = f"closest: {', '.join(lowered[c] for c in close)}" if close else f"e.g. {', '.join(known[:5])}"
        raise ConfigError(f"model.arch={arch} is not a keras.applications model ({hint})")
    model = _try_build(keras, arch, image_size)
    if model is None:
        smallest = _smallest_size(keras, arch, image_size)
        raise ConfigError(
            f"model.arch={arch} cannot take {image_size}x{image_size} images (data.image_size): the smallest size "
            f"it takes is {smallest} (data.image_size={smallest})"
        )
    return model


def _try_build(keras, arch: str, size: int):
    try:
        return getattr(keras.applications, arch)(weights=None, input_shape=(size, size, 3), classifier_activation=None)
    except ValueError:
        return None


def _smallest_size(keras, arch: str, failing: int) -> int:
    high = next((s for s in (DEFAULT_IMAGE_SIZE, 512) if _try_build(keras, arch, s) is not None), None)
    if high is None:
        raise ConfigError(f"model.arch={arch} cannot take {failing}x{failing} images (nor 224x224 or 512x512)")
    low = failing if failing < high else 0
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (low, middle) if _try_build(keras, arch, middle) is not None else (middle, high)
    return high

"""Loading weights from local files only: a state dict (.pth/.pt), an HDF5 file of named arrays, or
torchvision's pretrained file from the torch hub cache. Nothing is downloaded; unpickling runs no code."""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np

from runner.config import ConfigError

HDF5_SUFFIXES = (".h5", ".hdf5")


def pretrained_path(model: str) -> Path:
    """Where torchvision keeps its default weights for `model`: $TORCH_HOME/hub/checkpoints/<file>."""
    import torch.hub
    import torchvision

    try:
        weights = torchvision.models.get_model_weights(model).DEFAULT
    except ValueError:
        raise ConfigError(f"model={model} has no torchvision pretrained weights (use model.weights=FILE)") from None
    return Path(torch.hub.get_dir()) / "checkpoints" / Path(weights.url).name


def read_checkpoint(path: Path) -> dict[str, np.ndarray]:
    """Named float64 arrays from a state-dict file; refuses pickles that hold anything but tensors."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"weights file not found: {path}")
    if path.suffix in HDF5_SUFFIXES:
        return _read_hdf5(path)
    import torch

    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as error:
        reason = str(error).strip().splitlines()[0] if str(error).strip() else "not a plain state dict"
        raise ConfigError(f"refused to load {path}: it holds more than tensors ({reason[:200]})") from None
    except Exception as error:
        raise ConfigError(f"cannot read weights file {path}: {type(error).__name__}: {error}".splitlines()[0]) from None
    if isinstance(state, dict) and isinstance(state.get("state_dict"), dict):
        state = state["state_dict"]
    if not isinstance(state, dict):
        raise ConfigError(f"{path} holds a {type(state).__name__}, not a state dict")
    return {name: t.detach().double().numpy() for name, t in state.items() if t.is_floating_point()}


def _read_hdf5(path: Path) -> dict[str, np.ndarray]:
    import h5py

    arrays: dict[str, np.ndarray] = {}
    with h5py.File(path, "r") as f:
        group = f["weights"] if "weights" in f else f  # a runner's tensors.h5 keeps them under weights/
        group.visititems(
            lambda name, node: (
                arrays.__setitem__(name, np.asarray(node, np.float64)) if isinstance(node, h5py.Dataset) else None
            )
        )
    return arrays


def match_spec(loaded: dict[str, np.ndarray], spec: dict[str, tuple], source: Path) -> dict[str, np.ndarray]:
    """The loaded arrays in spec order; one clear line for a missing name or a wrong shape."""
    missing = [name for name in spec if name not in loaded]
    if missing:
        raise ConfigError(f"{source} lacks {len(missing)} weights the model needs, e.g. {', '.join(missing[:3])}")
    for name, shape in spec.items():
        if tuple(loaded[name].shape) != tuple(shape):
            raise ConfigError(f"{source}: {name} has shape {tuple(loaded[name].shape)}, the model needs {tuple(shape)}")
    return {name: loaded[name] for name in spec}

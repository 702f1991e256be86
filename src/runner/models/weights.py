"""Loading weights from local files only: a state dict (.pth/.pt), an HDF5 file of named arrays, or
torchvision's pretrained file from the torch hub cache. Nothing is downloaded; unpickling runs no code.

A `.pth` is read without torch: a restricted unpickler admits only the globals a state dict is made of
(OrderedDict, torch's tensor-rebuild functions, storage classes) and maps them to numpy, so a TensorFlow
process never imports torch (torch imported after TensorFlow crashes on some machines) and a pickle that
would run code is refused before anything runs. Both of torch's formats are read: the zip archive
(torch >= 1.6) and the legacy stream of pickles followed by raw storages (e.g. horse2zebra_0.4.0.pth).
"""

from __future__ import annotations

import collections
import io
import mmap
import os
import pickle
import struct
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from runner.config import ConfigError, first_line

HDF5_SUFFIXES = (".h5", ".hdf5")
# torchvision's DEFAULT weights for each architecture, by the file name the hub cache keeps them under
# (tests/test_weights.py checks this table against torchvision's own).
PRETRAINED_FILES = {
    "alexnet": "alexnet-owt-7be5be79.pth",
    "resnet18": "resnet18-f37072fd.pth",
    "resnet50": "resnet50-11ad3fa6.pth",
    "resnet101": "resnet101-cd907fc2.pth",
}
STORAGE_DTYPES = {
    "DoubleStorage": "f8",
    "FloatStorage": "f4",
    "HalfStorage": "f2",
    "BFloat16Storage": "u2",  # numpy has no bfloat16: read the bits, widened to float32 in _materialise
    "LongStorage": "i8",
    "IntStorage": "i4",
    "ShortStorage": "i2",
    "CharStorage": "i1",
    "ByteStorage": "u1",
    "BoolStorage": "?",
    "ComplexDoubleStorage": "c16",
    "ComplexFloatStorage": "c8",
}
LEGACY_MAGIC = 0x1950A86A20F9469CFC6C
LEGACY_PROTOCOL = 1001


def torch_hub_dir() -> Path:
    """torch.hub.get_dir() without importing torch: $TORCH_HOME/hub, else $XDG_CACHE_HOME/torch/hub."""
    cache = os.environ.get("XDG_CACHE_HOME", str(Path("~/.cache").expanduser()))
    return Path(os.environ.get("TORCH_HOME", os.path.join(cache, "torch"))).expanduser() / "hub"


def pretrained_path(model: str) -> Path:
    """Where torchvision keeps its default weights for `model`: $TORCH_HOME/hub/checkpoints/<file>."""
    if model not in PRETRAINED_FILES:
        raise ConfigError(f"model={model} has no torchvision pretrained weights (use model.weights=FILE)")
    return torch_hub_dir() / "checkpoints" / PRETRAINED_FILES[model]


def read_checkpoint(path: Path) -> dict[str, np.ndarray]:
    """Named float64 arrays from a state-dict file; refuses pickles that hold anything but tensors."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"weights file not found: {path}")
    if path.suffix in HDF5_SUFFIXES:
        return _read_hdf5(path)
    try:
        state = read_state_dict(path)
    except Refused as error:
        raise ConfigError(f"refused to load {path}: it holds more than tensors ({first_line(error)[:200]})") from None
    except (pickle.UnpicklingError, OSError, ValueError, EOFError, KeyError, zipfile.BadZipFile, struct.error) as error:
        reason = f"{type(error).__name__}: {first_line(error)[:200]}"
        raise ConfigError(f"cannot read weights file {path}: {reason}") from None
    if isinstance(state, dict) and isinstance(state.get("state_dict"), dict):
        state = state["state_dict"]
    if not isinstance(state, dict):
        raise ConfigError(f"{path} holds a {type(state).__name__}, not a state dict")
    return {
        name: array.astype(np.float64)
        for name, array in state.items()
        if isinstance(array, np.ndarray) and array.dtype.kind == "f"
    }


# -- torch's file formats, read with numpy ------------------------------------------------------


class Refused(pickle.UnpicklingError):
    """The pickle asks for something a state dict does not hold (a global that could run code)."""


@dataclass
class _Storage:
    """One storage of a checkpoint: its dtype and length now, its bytes once they are read."""

    dtype: np.dtype
    numel: int
    data: np.ndarray | None = None


@dataclass
class _Tensor:
    """A tensor's view of a storage, materialised once every storage has been read."""

    storage: _Storage
    offset: int
    size: tuple
    stride: tuple
    view_offset: int = 0  # legacy files: the storage is itself a view of a larger one


class _StateDictUnpickler(pickle.Unpickler):
    """Rebuilds tensors as `_Tensor` records; every other global is refused, so no code can run."""

    def __init__(self, file, storages: dict):
        super().__init__(file)
        self.storages = storages  # key -> _Storage, filled as persistent ids are met

    def find_class(self, module: str, name: str):
        if (module, name) == ("collections", "OrderedDict"):
            return collections.OrderedDict
        if module == "torch._utils" and name in ("_rebuild_tensor_v2", "_rebuild_tensor"):
            return _rebuild_tensor
        if (module, name) == ("torch._utils", "_rebuild_parameter"):
            return _rebuild_parameter
        if module == "torch" and name in STORAGE_DTYPES:
            return np.dtype(STORAGE_DTYPES[name]).newbyteorder("<")
        raise Refused(f"global {module}.{name} is not allowed in a state dict")

    def persistent_load(self, pid):
        if not (isinstance(pid, tuple) and len(pid) >= 5 and _ascii(pid[0]) == "storage"):
            raise pickle.UnpicklingError(f"persistent id {str(pid)[:80]} is not a storage")
        dtype, key, numel = pid[1], _ascii(pid[2]), pid[4]
        if not isinstance(dtype, np.dtype) or not isinstance(numel, int) or numel < 0:
            raise pickle.UnpicklingError(f"malformed storage reference {str(pid)[:80]}")
        storage = self.storages.setdefault(key, _Storage(dtype, numel))
        view = pid[5] if len(pid) > 5 else None  # legacy: (view_key, offset, size) of the root storage
        if view is None:
            return storage
        if not (isinstance(view, tuple) and len(view) == 3 and isinstance(view[1], int)):
            raise pickle.UnpicklingError(f"malformed storage view {str(view)[:80]}")
        return storage, view[1]


def _ascii(value) -> str:
    return value.decode("ascii") if isinstance(value, bytes) else str(value)


def _rebuild_tensor(storage, offset, size, stride, *_ignored) -> _Tensor:
    view_offset = 0
    if isinstance(storage, tuple):  # a legacy view: (root storage, offset into it)
        storage, view_offset = storage
    if not isinstance(storage, _Storage):
        raise pickle.UnpicklingError("a tensor is rebuilt from something other than a storage")
    return _Tensor(storage, view_offset + int(offset), tuple(size), tuple(stride))


def _rebuild_parameter(data, requires_grad, backward_hooks) -> _Tensor:
    return data


def read_state_dict(path: Path) -> object:
    """What torch.load(path, weights_only=True) returns, with numpy arrays in place of tensors."""
    with open(path, "rb") as f:
        if zipfile.is_zipfile(f):
            return _read_zip(f)
        f.seek(0)
        if f.read(262)[257:262] == b"ustar":
            raise ValueError("a tar checkpoint (torch < 0.4): load and re-save it with a current torch")
        f.seek(0)
        return _read_legacy(f)


def _read_zip(f) -> object:
    with zipfile.ZipFile(f) as archive:
        pickles = [name for name in archive.namelist() if name.endswith("/data.pkl")]
        if len(pickles) != 1:
            raise ValueError("a zip file without one data.pkl: not a torch.save checkpoint")
        prefix = pickles[0].removesuffix("data.pkl")
        if f"{prefix}constants.pkl" in archive.namelist():
            raise Refused("a TorchScript archive, not a state dict")
        big_endian = f"{prefix}byteorder" in archive.namelist() and archive.read(f"{prefix}byteorder") == b"big"
        storages: dict[str, _Storage] = {}
        result = _StateDictUnpickler(io.BytesIO(archive.read(pickles[0])), storages).load()
        mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        for key, storage in storages.items():
            dtype = storage.dtype.newbyteorder(">") if big_endian else storage.dtype
            storage.data = _zip_entry_array(archive, mapped, f"{prefix}data/{key}", dtype, storage.numel)
    return _materialise(result)


def _zip_entry_array(archive: zipfile.ZipFile, mapped: mmap.mmap, name: str, dtype: np.dtype, numel: int):
    """The entry's bytes as an array: torch stores storages uncompressed, so they are mapped, not copied."""
    info = archive.getinfo(name)
    if info.compress_type != zipfile.ZIP_STORED:
        return _storage_array(archive.read(name), dtype, numel)
    name_length, extra_length = struct.unpack("<2H", mapped[info.header_offset + 26 : info.header_offset + 30])
    start = info.header_offset + 30 + name_length + extra_length
    if info.file_size < numel * dtype.itemsize or start + info.file_size > len(mapped):
        raise ValueError(f"{name} holds {info.file_size} bytes, {numel * dtype.itemsize} expected (truncated file?)")
    return np.frombuffer(mapped, dtype, count=numel, offset=start)


def _read_legacy(f) -> object:
    header = _StateDictUnpickler(f, {})
    if header.load() != LEGACY_MAGIC:
        raise ValueError("not a torch checkpoint (no zip archive, no legacy magic number)")
    if header.load() != LEGACY_PROTOCOL:
        raise ValueError("unknown legacy torch protocol version")
    sys_info = header.load()
    if isinstance(sys_info, dict) and not sys_info.get("little_endian", True):
        raise ValueError("a big-endian legacy checkpoint")
    storages: dict[str, _Storage] = {}
    result = _StateDictUnpickler(f, storages).load()
    keys = _StateDictUnpickler(f, {}).load()
    for key in keys:
        storage = storages[_ascii(key)]
        (numel,) = struct.unpack("<q", f.read(8))
        storage.data = _storage_array(f.read(numel * storage.dtype.itemsize), storage.dtype, numel)
    return _materialise(result)


def _storage_array(raw: bytes, dtype: np.dtype, numel: int) -> np.ndarray:
    if len(raw) < numel * dtype.itemsize:
        raise ValueError(f"a storage holds {len(raw)} bytes, {numel * dtype.itemsize} expected (truncated file?)")
    return np.frombuffer(raw, dtype, count=numel)


def _materialise(value):
    """Replace every _Tensor in nested dicts, lists and tuples by its numpy array."""
    if isinstance(value, _Tensor):
        return _tensor_array(value)
    if isinstance(value, dict):
        return type(value)((k, _materialise(v)) for k, v in value.items())
    if isinstance(value, list | tuple):
        return type(value)(_materialise(v) for v in value)
    return value


def _tensor_array(t: _Tensor) -> np.ndarray:
    data = t.storage.data
    if data is None:
        raise ValueError("a tensor refers to a storage the file does not hold")
    if len(t.size) != len(t.stride) or any(n < 0 for n in t.size) or any(s < 0 for s in t.stride):
        raise ValueError(f"a tensor has an invalid size {t.size} / stride {t.stride}")
    if 0 in t.size:
        return np.zeros(t.size, _native(data.dtype))
    last = t.offset + sum((n - 1) * s for n, s in zip(t.size, t.stride, strict=True))
    if t.offset < 0 or last >= len(data):  # as_strided would read memory outside the storage
        raise ValueError(f"a tensor reaches element {last} of a storage of {len(data)}")
    if t.stride == _contiguous_strides(t.size):
        array = data[t.offset : t.offset + int(np.prod(t.size))].reshape(t.size)  # a view: no copy
    else:
        strides = tuple(s * data.itemsize for s in t.stride)
        array = np.lib.stride_tricks.as_strided(data[t.offset :], t.size, strides, writeable=False)
    if data.dtype.kind == "u" and data.dtype.itemsize == 2:  # bfloat16 bits (see STORAGE_DTYPES) -> float32
        return (array.astype(np.uint32) << 16).view(np.float32)
    return array if array.dtype.isnative else array.astype(_native(array.dtype))


def _contiguous_strides(size: tuple) -> tuple:
    strides, step = [], 1
    for n in reversed(size):
        strides.append(step)
        step *= max(n, 1)
    return tuple(reversed(strides))


def _native(dtype: np.dtype) -> np.dtype:
    return dtype.newbyteorder("=")


# -- HDF5 ----------------------------------------------------------------------------------------


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

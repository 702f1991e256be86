"""Reading weights files, local only: a torch state dict (.pth, .bin), a safetensors file, an HDF5 file of named arrays,
or torchvision's pretrained file from the torch hub cache. Nothing is downloaded; unpickling runs no code. A Hugging
Face folder, and matching what was read against a model's names, are runner.models.checkpoints'.

A file's format is told by its first bytes, never by its suffix (`file_format`): a zip archive or a pickle (torch),
`\x89HDF` (HDF5), or an 8-byte little-endian header length followed by JSON (safetensors, read with the `safetensors`
library; its bfloat16 tensors, which numpy cannot hold, are read as bits and widened to float32). Every message names
the file.

A torch file is read without torch: a restricted unpickler admits only the globals a state dict is made of
(OrderedDict, torch's tensor-rebuild functions, storage classes) and maps them to numpy, so a TensorFlow
process never imports torch (torch imported after TensorFlow crashes on some machines) and a pickle that
would run code is refused before anything runs. Both of torch's formats are read: the zip archive
(torch >= 1.6) and the legacy stream of pickles followed by raw storages (e.g. horse2zebra_0.4.0.pth).
"""

from __future__ import annotations

import collections
import io
import json
import mmap
import os
import pickle
import struct
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from runner.config import ConfigError, first_line

HDF5_SIGNATURE = b"\x89HDF\r\n\x1a\n"
NUMERIC_KINDS = "fiu"  # what read_checkpoint turns into float64 (bools, strings and objects are no weights)
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
# safetensors' dtypes that safetensors.numpy returns as numpy arrays (BF16 is read as bits; F8_* are refused)
SAFETENSORS_NUMPY = ("F64", "F32", "F16", "I64", "I32", "I16", "I8", "U64", "U32", "U16", "U8", "BOOL")
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
    """Named float64 arrays from a weights file (its numeric tensors); refuses a pickle of more than tensors."""
    arrays = read_arrays(path).items()
    return {name: array.astype(np.float64) for name, array in arrays if array.dtype.kind in NUMERIC_KINDS}


def read_arrays(path: Path) -> dict[str, np.ndarray]:
    """Every tensor of a weights file as a numpy array of its own dtype (bfloat16 widened to float32), whatever the
    file's format (`file_format`, by content); one line naming the file for anything else."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"weights file not found: {path}")
    kind = file_format(path)
    if kind == "hdf5":
        return _read_hdf5(path)
    if kind == "safetensors":
        return _read_safetensors(path)
    if kind != "torch":
        raise ConfigError(
            f"cannot read weights file {path}: not a torch (zip or pickle), safetensors or HDF5 file "
            f"(it starts with {kind})"
        )
    return _state_dict_arrays(path)


def file_format(path: Path) -> str:
    """The format of a weights file from its first bytes ("torch", "safetensors", "hdf5"); else those bytes."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(16)
        if head.startswith(b"PK\x03\x04") or head[:2] in (b"\x80\x02", b"\x80\x03", b"\x80\x04", b"\x80\x05"):
            return "torch"  # a zip archive (torch >= 1.6) or a pickle's PROTO opcode (the legacy format)
        if len(head) >= 9 and head[8:9] == b"{" and 2 <= struct.unpack("<Q", head[:8])[0] <= size - 8:
            return "safetensors"  # its header's length, then the header: JSON
        if any(_at(f, offset, 8) == HDF5_SIGNATURE for offset in (0, 512, 1024, 2048)):  # after a user block, if any
            return "hdf5"
        if _at(f, 257, 5) == b"ustar":
            return "torch"  # torch < 0.4's tar archive, which read_state_dict refuses with a word on re-saving it
    return repr(head[:8]) if head else "nothing: it is empty"


def _at(f, offset: int, n: int) -> bytes:
    f.seek(offset)
    return f.read(n)


def _state_dict_arrays(path: Path) -> dict[str, np.ndarray]:
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
    return {name: array for name, array in state.items() if isinstance(array, np.ndarray)}


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

    def keep(name: str, node: object) -> None:
        if isinstance(node, h5py.Dataset):
            arrays[name] = np.asarray(node)

    try:
        with h5py.File(path, "r") as f:
            (f["weights"] if "weights" in f else f).visititems(keep)  # a runner's tensors.h5 keeps them under weights/
    except OSError as error:
        raise ConfigError(f"cannot read weights file {path}: {first_line(error)[:200]}") from None
    return arrays


# -- safetensors -----------------------------------------------------------------------------------


def _read_safetensors(path: Path) -> dict[str, np.ndarray]:
    """Every tensor through the safetensors library; bfloat16 ones, which numpy cannot hold, from their bits."""
    from safetensors import SafetensorError, safe_open

    header, data_start = _safetensors_header(path)
    arrays: dict[str, np.ndarray] = {}
    try:
        with safe_open(path, framework="np") as f:  # checks the header's offsets against the file
            for name in f.keys():
                kind = header[name]["dtype"]
                if kind == "BF16":
                    arrays[name] = _bfloat16_tensor(path, header[name], data_start)
                elif kind not in SAFETENSORS_NUMPY:
                    raise ConfigError(f"cannot read weights file {path}: {name} is {kind}, which numpy cannot hold")
                else:
                    arrays[name] = f.get_tensor(name)
    except (SafetensorError, OSError, TypeError, ValueError, KeyError) as error:
        reason = f"{type(error).__name__}: {first_line(error)[:200]}"
        raise ConfigError(f"cannot read weights file {path}: {reason}") from None
    return arrays


def _safetensors_header(path: Path) -> tuple[dict[str, dict], int]:
    """({name: {"dtype", "shape", "data_offsets"}}, where the data start in the file)."""
    with open(path, "rb") as f:
        (length,) = struct.unpack("<Q", f.read(8))
        try:
            header = json.loads(f.read(length))
        except (UnicodeDecodeError, json.JSONDecodeError) as error:
            raise ConfigError(
                f"cannot read weights file {path}: a safetensors header that is not JSON ({error})"
            ) from None
    if isinstance(header, dict):
        header.pop("__metadata__", None)
    if not isinstance(header, dict) or not all(isinstance(v, dict) and "dtype" in v for v in header.values()):
        raise ConfigError(f"cannot read weights file {path}: a malformed safetensors header")
    return header, 8 + length


def _bfloat16_tensor(path: Path, entry: dict, data_start: int) -> np.ndarray:
    """A bfloat16 tensor as float32, exactly: its bits are the upper half of a float32's."""
    begin, end = entry["data_offsets"]
    bits = np.fromfile(path, "<u2", count=(end - begin) // 2, offset=data_start + begin)
    return (bits.astype(np.uint32) << 16).view(np.float32).reshape(tuple(entry["shape"]))

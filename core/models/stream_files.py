"""The streamed load's other source: a diffusers folder's denoiser, read a tensor at a time
from `<subfolder>/diffusion_pytorch_model*.safetensors` (core/models/stream_load.py
places it).

The module is built from `<subfolder>/config.json` on the meta device (the class its
`_class_name` names, as from_pretrained builds it); each parameter is read from its file
by offset when `place_streamed` reaches its layer and cast to the dtype from_pretrained
would give it. Read with pread, not a memory map: the pages of a mapped file count in
the process's resident memory until it is unmapped, so reading a 40 GB file through one
would show 40 GB resident. Torch is imported inside the functions.
"""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path
from typing import Any

from core.models.stream_load import StreamedDenoiser

WEIGHTS = "diffusion_pytorch_model*.safetensors"
_DTYPES = {"F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16",
           "I64": "int64", "I32": "int32", "I16": "int16", "I8": "int8", "U8": "uint8",
           "BOOL": "bool", "F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2"}


def weight_files(folder: str | Path, subfolder: str) -> list[Path]:
    """The denoiser's safetensors files in a diffusers folder (one, or the shards)."""
    return sorted((Path(folder) / subfolder).glob(WEIGHTS))


def _tensor_index(files: list[Path]) -> dict[str, tuple[Path, dict[str, Any], int]]:
    """Every tensor's file, header entry and the offset its file's data starts at."""
    out = {}
    for path in files:
        with open(path, "rb") as fh:
            (size,) = struct.unpack("<Q", fh.read(8))
            header = json.loads(fh.read(size))
        for name, entry in header.items():
            if name != "__metadata__":
                out[name] = (path, entry, 8 + size)
    return out


def _read(path: Path, entry: dict[str, Any], start: int) -> Any:
    """One tensor of a safetensors file, as stored, read into fresh CPU memory."""
    import torch

    begin, end = entry["data_offsets"]
    data = bytearray(end - begin)
    with open(path, "rb") as fh:
        if os.preadv(fh.fileno(), [data], start + begin) != len(data):
            raise OSError(f"{path}: short read")
    dtype = getattr(torch, _DTYPES[entry["dtype"]])
    if not data:
        return torch.empty(entry["shape"], dtype=dtype)
    return torch.frombuffer(data, dtype=dtype).reshape(entry["shape"])


def _loaded_dtype(module: Any, full: str, entry: dict[str, Any], dtype: Any) -> Any:
    """What diffusers' from_pretrained gives a stored tensor at `dtype`: float32 in the
    `_keep_in_fp32_modules` (a name part equal to one, at any dtype), the stored dtype
    for integers, `dtype` for the other floats."""
    import torch

    stored = getattr(torch, _DTYPES[entry["dtype"]])
    if not stored.is_floating_point:
        return stored
    keep = getattr(module, "_keep_in_fp32_modules", None) or []
    if any(k in full.split(".") for k in ([keep] if isinstance(keep, str) else keep)):
        return torch.float32
    return dtype


def folder_denoiser(folder: str, subfolder: str, dtype: Any
                    ) -> tuple[Any, StreamedDenoiser] | str:
    """The folder's denoiser on the meta device with its filler, or why it cannot stream
    (then its loader reads it whole, as before): no safetensors, a class diffusers does
    not have, or tensor names that differ from the module's (a checkpoint from_pretrained
    would convert)."""
    import diffusers

    from core.models.empty import empty_weights
    from core.models.stream_load import meta_parameters

    if dtype is None:  # the loader keeps the stored dtype then; so does the whole load
        return "no training dtype to load it in"
    files = weight_files(folder, subfolder)
    if not files:
        return f"{subfolder}/ holds no {WEIGHTS}"
    where = Path(folder) / subfolder
    config = json.loads((where / "config.json").read_text())
    cls = getattr(diffusers, str(config.get("_class_name")), None)
    if cls is None:
        return f"diffusers has no class {config.get('_class_name')!r}"
    with empty_weights():
        module = cls.from_config(cls.load_config(str(where)))
    index = _tensor_index(files)
    names = {n for n, _ in module.named_parameters()}
    if names - set(index):
        return (f"{len(names - set(index))} of the module's parameters are not in the "
                f"files by name (e.g. {sorted(names - set(index))[0]})")
    meta_parameters(module, lambda full: _loaded_dtype(module, full, index[full][1], dtype))

    def fill(full: str, owner: Any, meta: Any) -> Any:
        return _read(*index[full]).to(meta.dtype)

    module.requires_grad_(False)
    return module.eval(), StreamedDenoiser(str(where), fill)

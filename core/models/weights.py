"""What identifies a model's weights and in which precision they load: `fingerprint` gives
caches a stable id of the weights (a different model rebuilds them), `resolve_dtype` reads
the config's precision names. No torch at import."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from core.models.source import SourceKind

# ---------------------------------------------------------------- fingerprint

_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".ckpt", ".gguf")


def fingerprint(path: str, kind: SourceKind, revision: str = "main") -> str:
    """A stable id of the weights, recorded in caches so a different model rebuilds them.

    Folder: model_index.json and every component's config/tokenizer JSON contents plus
    each weight file's name, size and mtime (hashing gigabytes of weights is too slow).
    File: its resolved path, size and mtime. Hub id: the id and revision.
    """
    h = hashlib.sha256()
    if kind == "hub":
        h.update(f"hub:{path}@{revision}".encode())
    elif kind == "file":
        st = Path(path).stat()
        h.update(f"file:{Path(path).resolve()}:{st.st_size}:{st.st_mtime_ns}".encode())
    else:
        root = Path(path)
        for f in sorted(p for p in root.rglob("*") if p.is_file()):
            rel = f.relative_to(root).as_posix()
            if f.suffix == ".json" or f.suffix == ".txt":
                h.update(f"{rel}\0".encode() + f.read_bytes() + b"\0")
            elif f.suffix in _WEIGHT_SUFFIXES:
                st = f.stat()
                h.update(f"{rel}:{st.st_size}:{st.st_mtime_ns}\0".encode())
    return h.hexdigest()[:16]


# ---------------------------------------------------------------- dtypes


def resolve_dtype(dtype: Any) -> Any:
    """Accept None, a torch dtype, or the config strings "no"/"fp16"/"bf16"/"fp32"."""
    import torch

    if dtype is None or isinstance(dtype, torch.dtype):
        return dtype
    table = {"no": torch.float32, "fp32": torch.float32, "float32": torch.float32,
             "fp16": torch.float16, "float16": torch.float16,
             "bf16": torch.bfloat16, "bfloat16": torch.bfloat16}
    if str(dtype) not in table:
        raise ValueError(f"unknown dtype {dtype!r}; use one of {', '.join(table)}")
    return table[str(dtype)]

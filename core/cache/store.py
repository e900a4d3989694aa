"""One safetensors file per cache entry, written atomically and checked before use.

Every entry records what it was made from in its safetensors metadata (strings), so a
changed image, model or setting invalidates exactly the stale entries and nothing else is
rewritten. A writer never exposes a half file: it writes a temp file in the same folder,
fsyncs it and renames it over the target. A reader that finds a file it cannot load
reports it and deletes it so it is rebuilt, never trained on.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import time
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from core.files import write_bytes

CACHE_FORMAT = "1"
TMP_PREFIX = ".tmp-"
LOCK_SHARDS = 64


class CacheWriteError(Exception):
    """A cache file could not be written (disk full, permissions); the partial is gone."""


class CacheReadError(Exception):
    """A cache file exists but does not load; it has been deleted so it gets rebuilt."""


def read_metadata(path: Path) -> dict[str, str] | None:
    """The entry's recorded sources, read from the header only; None when absent or broken.

    A file whose header does not parse is treated as missing (and will be rewritten).
    """
    try:
        with open(path, "rb") as handle:
            file_size = os.fstat(handle.fileno()).st_size
            size = int.from_bytes(handle.read(8), "little")
            if size <= 0 or size > 100_000_000 or size + 8 > file_size:
                return None
            header = json.loads(handle.read(size))
        if not isinstance(header, dict):
            return None
        # A file cut short keeps a valid header; the data must reach the end exactly.
        ends = [t["data_offsets"][1] for k, t in header.items() if k != "__metadata__"]
        if 8 + size + max(ends, default=0) != file_size:
            return None
    except (OSError, ValueError, KeyError, TypeError, IndexError):
        return None
    meta = header.get("__metadata__")
    return meta if isinstance(meta, dict) else None


def is_fresh(path: Path, expected: dict[str, str]) -> bool:
    """True when the file exists and every expected field matches what it records."""
    meta = read_metadata(path)
    return meta is not None and all(meta.get(k) == v for k, v in expected.items())


def atomic_save(tensors: dict[str, Any], metadata: dict[str, str], path: Path) -> None:
    """Write tensors + metadata to `path` so that no reader ever sees a partial file."""
    from safetensors.torch import save

    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise CacheWriteError(f"cannot create cache folder {path.parent}: "
                              f"{exc.strerror or exc}; pick a writable folder") from exc
    meta = {"cache_format": CACHE_FORMAT, **{k: str(v) for k, v in metadata.items()}}
    data = save({k: v.detach().contiguous().cpu() for k, v in tensors.items()}, metadata=meta)
    try:  # creating the temp file fails too on a read-only folder
        # a unique `.tmp-*.part` name: remove_stale_temp_files and the cache clear find it
        write_bytes(path, data, unique=(TMP_PREFIX, ".part"), fsync=True)
    except OSError as exc:
        reason = "the disk is full" if exc.errno == errno.ENOSPC else exc.strerror or str(exc)
        raise CacheWriteError(f"cannot write cache file {path}: {reason}; the partial file "
                              "was removed. Free space or pick another cache folder, then "
                              "run again: finished entries are kept.") from exc


def load_entry(path: Path) -> tuple[dict[str, Any], dict[str, str]]:
    """Load every tensor of an entry; a file that fails is deleted and CacheReadError raised."""
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="pt") as handle:
            meta = handle.metadata() or {}
            tensors = {key: handle.get_tensor(key) for key in handle.keys()}  # noqa: SIM118
    except Exception as exc:  # safetensors raises several types for a broken file
        with contextlib.suppress(OSError):
            path.unlink()
        raise CacheReadError(f"cache file {path} does not load ({exc}); deleted it so it is "
                             "rebuilt") from exc
    return tensors, meta


def remove_stale_temp_files(folder: Path, older_than_s: float = 120.0) -> int:
    """Temp files left by a killed writer. They are never read; clearing only old ones
    keeps a writer that is running right now in another process safe."""
    if not folder.is_dir():
        return 0
    removed, now = 0, time.time()
    for tmp in folder.rglob(f"{TMP_PREFIX}*.part"):
        with contextlib.suppress(OSError):
            if now - tmp.stat().st_mtime > older_than_s:
                tmp.unlink()
                removed += 1
    return removed


@contextlib.contextmanager
def entry_lock(path: Path) -> Iterator[None]:
    """An exclusive advisory lock for one entry, for processes that could meet on it
    (two runs sharing a text cache). Locks are sharded over a few files per folder so the
    cache does not fill with one lock file per entry."""
    locks = path.parent / ".locks"
    try:
        locks.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise CacheWriteError(f"cannot create cache folder {locks}: {exc.strerror or exc}; "
                              "pick a writable folder") from exc
    lock_path = locks / f"{zlib.crc32(path.name.encode()) % LOCK_SHARDS:02d}.lock"
    with open(lock_path, "a+b") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)

"""Files and folders written in one place: to a temp name in the same folder, then one
rename over the target, so a reader (the UI's gallery, a resumed run, another process)
sees the old file or the new one, never half of one.

`atomic_path` is the one write-to-temp-then-replace: it yields the temp path for any
writer (safetensors' save_file, an image's save, a folder filled file by file), renames
it into place on a clean exit and removes it when the writer fails. `write_bytes`,
`write_text` and `write_json` are its everyday uses. Each caller keeps its own temp
name (`temp`; default `.{name}.tmp`), since some are looked for by name (the cache
clears its `.tmp-*.part` leftovers, the gallery skips dotfiles), or `unique` names
from tempfile where two processes may write the same target at once.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

Swap = Callable[[Path, Path], Any]


@contextlib.contextmanager
def atomic_path(path: Path, *, temp: str | None = None,
                unique: tuple[str, str] | None = None, folder: bool = False,
                fsync: bool = False, swap: Swap | None = None) -> Iterator[Path]:
    """The temp path beside `path` to write; renamed over `path` when the block ends
    without an exception, removed when it raises (and before it starts, when a killed
    writer left one under the same name).

    temp: the temp's name (default `.{name}.tmp`). unique: (prefix, suffix) of a name
    tempfile makes instead, created empty (a file, or with `folder` a folder). folder:
    the temp is an empty folder to fill. fsync: the file's data and the folder's entry
    reach the disk before this returns (a cache entry must survive a power cut).
    swap: how the finished temp takes the target's place (None: os.replace, looked up
    at the call so a test can make it fail; replace_folder when an old folder is
    there; keep_first when another writer's may be)."""
    path = Path(path)
    if unique is not None:
        prefix, suffix = unique
        if folder:
            tmp = Path(tempfile.mkdtemp(prefix=prefix, suffix=suffix, dir=path.parent))
        else:
            fd, name = tempfile.mkstemp(prefix=prefix, suffix=suffix, dir=path.parent)
            os.close(fd)
            tmp = Path(name)
    else:
        tmp = path.with_name(temp or f".{path.name}.tmp")
        _remove(tmp)
        if folder:
            tmp.mkdir(parents=True)
    try:
        yield tmp
        if fsync and tmp.is_file():
            with open(tmp, "rb") as handle:
                os.fsync(handle.fileno())
        (swap or os.replace)(tmp, path)
    finally:
        _remove(tmp)
    if fsync:
        _fsync_folder(path.parent)


def write_bytes(path: Path, data: bytes, **how: Any) -> Path:
    """`data` into `path` atomically; `how`: atomic_path's temp, unique and fsync."""
    with atomic_path(path, **how) as tmp:
        tmp.write_bytes(data)
    return Path(path)


def write_text(path: Path, text: str, **how: Any) -> Path:
    """`text` (UTF-8) into `path` atomically; `how`: atomic_path's temp and unique."""
    return write_bytes(path, text.encode("utf-8"), **how)


def write_json(path: Path, data: Any, **how: Any) -> Path:
    """`data` as JSON (indent 1, a final newline; NaN and infinity refused, since no
    reader but Python's would parse them) into `path` atomically."""
    return write_text(path, json.dumps(data, indent=1, allow_nan=False) + "\n", **how)


def replace_folder(tmp: Path, path: Path) -> None:
    """A swap for folders: os.replace cannot rename over a folder that holds files, so
    an old one is moved aside (and deleted) first."""
    if path.exists():
        old = path.with_name(f".{path.name}.old-{os.getpid()}")
        os.replace(path, old)
        shutil.rmtree(old, ignore_errors=True)
    os.replace(tmp, path)


def keep_first(tmp: Path, path: Path) -> None:
    """A swap for a build any process may finish: one already in place (another
    process's, complete) is kept and this one dropped."""
    if not path.exists():
        os.replace(tmp, path)


def _remove(tmp: Path) -> None:
    if tmp.is_dir() and not tmp.is_symlink():
        shutil.rmtree(tmp, ignore_errors=True)
    else:
        with contextlib.suppress(OSError):
            tmp.unlink()


def _fsync_folder(folder: Path) -> None:
    """The rename itself on disk (a folder's entries are synced through the folder)."""
    with contextlib.suppress(OSError):
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

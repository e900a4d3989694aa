"""Delete one dataset's VAE-latent cache, and nothing else.

Only files the cache layer writes are removed: `*.safetensors` entries, `.tmp-*.part`
leftovers and the `.locks/*.lock` files; then the folders left empty. Anything else in the
folder (a user's file, an image) stays. A cache folder that is, contains or lies inside
an images folder is refused outright: clearing it could never be safe to reason about.
Symlinks are never followed.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from core.cache.plan import ENTRY_SUFFIX
from core.cache.store import TMP_PREFIX
from core.config import Config, DatasetConfig
from core.data.conflicts import relation


class ClearRefused(ValueError):
    """The cache folder cannot be cleared safely; the message says why and what to do."""


@dataclass
class CacheFiles:
    folder: Path
    files: list[Path] = field(default_factory=list)
    bytes: int = 0

    @property
    def entries(self) -> int:
        """Cache entries (one per image); the rest are lock and leftover temp files."""
        return sum(1 for p in self.files if p.name.endswith(ENTRY_SUFFIX))

    def describe(self) -> str:
        return (f"{self.entries} cache entr{'y' if self.entries == 1 else 'ies'} "
                f"({len(self.files)} files, {self.bytes / 1e6:.1f} MB) in {self.folder}")


def _is_cache_file(path: Path) -> bool:
    name = path.name
    if name.endswith(ENTRY_SUFFIX) and not name.startswith(TMP_PREFIX):
        return True
    if name.startswith(TMP_PREFIX) and name.endswith(".part"):
        return True
    return path.parent.name == ".locks" and name.endswith(".lock")


def _guard(ds: DatasetConfig, others: list[DatasetConfig]) -> Path:
    if not ds.vae_cache.strip():
        raise ClearRefused(f"dataset '{ds.id}' has no vae_cache folder set; nothing to clear")
    folder = Path(ds.vae_cache)
    for other in others:
        if other.images.strip() and relation(folder, other.images) is not None:
            raise ClearRefused(
                f"dataset '{ds.id}' vae_cache {folder} overlaps the images folder "
                f"{other.images} of dataset '{other.id}'; fix the folders first (the check "
                "shows the conflict). Nothing was deleted.")
    return folder


def find_cache_files(ds: DatasetConfig, cfg: Config) -> CacheFiles:
    """What `clear_dataset_cache` would delete (for the confirmation prompt)."""
    folder = _guard(ds, cfg.datasets)
    found = CacheFiles(folder)
    if not folder.is_dir():
        return found
    for root, _dirs, names in os.walk(folder, followlinks=False):
        for name in names:
            path = Path(root) / name
            if not path.is_symlink() and _is_cache_file(path):
                found.files.append(path)
                found.bytes += path.stat().st_size
    return found


def clear_dataset_cache(ds: DatasetConfig, cfg: Config) -> CacheFiles:
    """Delete the cache files of `ds` (paths resolved); returns what was deleted."""
    found = find_cache_files(ds, cfg)
    for path in found.files:
        path.unlink(missing_ok=True)
    for root, _dirs, _names in sorted(os.walk(found.folder), key=lambda t: -len(t[0])):
        if Path(root) != found.folder:
            try:
                os.rmdir(root)  # only succeeds when empty: user files keep their folder
            except OSError:
                pass
    return found

"""The sizes a memory estimate read, kept on disk between processes.

Counting a model's parameters means building it on the meta device, and importing
diffusers and transformers for that takes 4 to 7 CPU-seconds: most of what
`--stage check` costs, paid again by every headless run and every `app.py` start. The
counts depend only on the configs, the run's adapter settings, the libraries' versions
and the counting code, so they are kept under a key made of all of them: an edited
config.json, another rank, a library upgrade or a change to core/models/ or
core/memory/ reads the model again, and nothing stale is ever used. A single-file
checkpoint is keyed by its path, size and modification time as well.

Where: $DT_CACHE_DIR, else $XDG_CACHE_HOME/diffusion-finetuner, else
~/.cache/diffusion-finetuner (`memory-sizes/<key>.json`, a few KB each). A cache that
cannot be read or written is no error: the sizes are counted as before.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import logging
import os
from importlib import metadata
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)
CACHE_ENV = "DT_CACHE_DIR"
LIBRARIES = ("diffusers", "transformers", "peft", "torch", "accelerate")
# The families (core/models) and the counting code (this package: model_counts.py).
CODE = (Path(__file__).resolve().parent.parent / "models", Path(__file__).resolve().parent)


def cache_dir() -> Path:
    explicit = os.environ.get(CACHE_ENV)
    if explicit:
        return Path(explicit).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "diffusion-finetuner"


@functools.lru_cache(maxsize=1)
def _code_and_libraries() -> str:
    digest = hashlib.sha256()
    for folder in CODE:
        for path in sorted(folder.rglob("*.py")):
            digest.update(str(path.relative_to(folder.parent)).encode())
            digest.update(path.read_bytes())
    for name in LIBRARIES:
        try:
            digest.update(f"{name}={metadata.version(name)}".encode())
        except metadata.PackageNotFoundError:
            digest.update(f"{name}=none".encode())
    return digest.hexdigest()


def sizes_key(folder: Path, file: Path | None, settings: tuple[Any, ...]) -> str:
    """The key of one reading: the configs' bytes, the single file's identity, the
    adapter settings, the libraries and the counting code."""
    digest = hashlib.sha256(_code_and_libraries().encode())
    digest.update(repr(settings).encode())
    for path in [folder / "model_index.json", *sorted(folder.glob("*/config.json"))]:
        digest.update(str(path.relative_to(folder)).encode())
        digest.update(path.read_bytes())
    if file is not None:
        stat = file.stat()
        digest.update(f"{file.resolve()}:{stat.st_size}:{stat.st_mtime_ns}".encode())
    return digest.hexdigest()[:40]


def load(key: str) -> dict[str, Any] | None:
    path = cache_dir() / "memory-sizes" / f"{key}.json"
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def store(key: str, data: dict[str, Any]) -> None:
    from core.files import write_json

    path = cache_dir() / "memory-sizes" / f"{key}.json"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_json(path, data, unique=(f".{key}.", ".tmp"))
    except (OSError, TypeError, ValueError) as exc:  # read-only home, odd config value
        log.debug("memory sizes not cached at %s: %s", path, exc)


def plain(sizes: Any) -> dict[str, Any]:
    """The sizes as JSON would give them back (a config's tuples as lists), so a
    reading from the disk and a fresh one are the same."""
    return json.loads(json.dumps(dataclasses.asdict(sizes), default=str))


def sizes_from_plain(data: dict[str, Any]) -> Any:
    """ModelSizes again from `plain`'s dict."""
    from core.memory.model_counts import BlockSize, ComponentSize, DenoiserSize, ModelSizes

    def denoiser(d: dict[str, Any] | None) -> DenoiserSize | None:
        if d is None:
            return None
        return DenoiserSize(**{**d, "blocks": [BlockSize(**b) for b in d["blocks"]]})

    vae = data["vae"]
    return ModelSizes(data["family"], denoiser(data["denoiser"]),
                      ComponentSize(**vae) if vae is not None else None,
                      [ComponentSize(**t) for t in data["text_encoders"]],
                      denoiser(data["second_expert"]))


def kept_key(path: str, family: str, workspace: Path, settings: tuple[Any, ...]) -> str | None:
    """The key model.path's sizes with these adapter `settings` (rank, scope, with LoRA,
    kind) are kept under, or None when its configs cannot be found (the full reading
    says why). An unbuilt tiny model is keyed by its name: its configs come from this
    package's code, which every key holds, so no build is needed to find them. Imports
    neither diffusers nor torch."""
    from core.memory.config_source import config_source
    from core.models.source import model_source
    from core.models.tiny import tiny_is_built

    source = model_source(path)
    if source.kind == "tiny" and not tiny_is_built(source.name, workspace):
        digest = hashlib.sha256(_code_and_libraries().encode())
        digest.update(repr(("unbuilt tiny", source.name, *settings)).encode())
        return digest.hexdigest()[:40]
    try:
        with config_source(path, family, workspace) as found:
            return sizes_key(found.folder, found.file, (found.family, *settings))
    except Exception:  # noqa: BLE001 - the full reading says what is wrong, if anything
        return None


def cached_sizes(key: str | None) -> Any:
    """The sizes kept under `key` (kept_key), or None."""
    data = load(key) if key is not None else None
    return None if data is None else sizes_from_plain(data)


def read_and_keep(source: Any, settings: tuple[Any, ...], key: str | None) -> Any:
    """model_counts.read_sizes of `source` (a ConfigSource) with these adapter
    `settings`, kept on the disk under `key` for the next process."""
    from core.memory.model_counts import read_sizes

    data = plain(read_sizes(source, *settings))
    if key is not None:
        store(key, data)
    return sizes_from_plain(data)

"""Where a model comes from: `model.path` classified once into a `ModelSource`.

A model.path is one of
- `tiny:<name>`: a tiny model built offline in the workspace (the demo's, the tests'),
- `random:<family>`: a full-size architecture with random weights (no files),
- a local diffusers folder (holding model_index.json, or modular_model_index.json for a
  model diffusers ships as modular pipelines only),
- a single-file `.safetensors` checkpoint,
- a hub id `owner/name`,
and anything else is a path that does not exist. Loading, the cache status, the memory
estimate and `--stage check` all start from `model_source(path)`, so the kinds and their
messages are decided here and nowhere else. No torch, no network at import.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from core.problems import Problem, error

TINY_PREFIX = "tiny:"
RANDOM_PREFIX = "random:"

# A diffusers folder's index: a pipeline's, or a modular pipeline's (a model diffusers
# ships as modular pipelines only has no other), in the order they are read.
INDEX_FILES = ("model_index.json", "modular_model_index.json")

SourceKind = Literal["folder", "file", "hub"]  # the kinds that are loaded from files
Kind = Literal["tiny", "random", "folder", "file", "hub", "missing"]

# A hub id is "owner/name" (an optional "@revision" is not supported by from_pretrained).
HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


class ModelLoadError(Exception):
    """A model cannot be loaded; `problem` names the path and what to do."""

    def __init__(self, where: str, message: str):
        self.problem: Problem = error(where, message)
        super().__init__(str(self.problem))


@dataclass(frozen=True)
class ModelSource:
    """One model.path, classified. `name` is what follows tiny: or random:, else the path."""

    text: str
    kind: Kind
    name: str

    @property
    def built(self) -> bool:
        """Built here (tiny, random), not read from files or the hub as written."""
        return self.kind in ("tiny", "random")


def model_source(text: str) -> ModelSource:
    """Classify `text` (a model.path or model.config, resolved against the workspace
    already). Never raises; `loadable_kind` says why a source cannot be loaded."""
    for prefix, kind in ((TINY_PREFIX, "tiny"), (RANDOM_PREFIX, "random")):
        if text.startswith(prefix):
            return ModelSource(text, kind, text[len(prefix):])
    p = Path(text).expanduser() if text else None
    if p is not None and p.is_dir():
        return ModelSource(text, "folder", text)
    if p is not None and p.is_file():
        return ModelSource(text, "file", text)
    # "owner/name" and nothing else; "data/model.safetensors" is a missing file, not an id.
    if HUB_ID.match(text) and not text.lower().endswith((".safetensors", ".ckpt")):
        return ModelSource(text, "hub", text)
    return ModelSource(text, "missing", text)


def classify_source(path: str) -> SourceKind:
    """Say whether `path` is a local diffusers folder, a single file, or a hub id.

    Raises ModelLoadError with a message that names the path when it is none of these.
    """
    source = model_source(path)
    if not path:
        raise ModelLoadError("model.path", "is empty: give a hub id, a diffusers folder, "
                             "a .safetensors file or tiny:<family>")
    if source.kind == "tiny":
        raise ModelLoadError(path, "tiny models must be resolved first with "
                             "core.models.tiny.resolve_model_path(path, workspace)")
    if source.kind == "random":
        raise ModelLoadError(path, "is a full-size architecture with random weights: it is "
                             "built, not loaded from files, by core.models.full_size.build."
                             "build_random (core.startup.load_model does so)")
    p = Path(path).expanduser()
    if source.kind == "folder" and index_file(p) is None:
        raise ModelLoadError(path, "is a folder but not a diffusers model folder (no "
                             "model_index.json, nor a modular pipeline's "
                             "modular_model_index.json); point model.path at the folder "
                             "that holds one, or at a .safetensors file")
    if source.kind == "file" and p.suffix.lower() != ".safetensors":
        raise ModelLoadError(path, f"is a {p.suffix or 'extensionless'} file; only "
                             ".safetensors single-file checkpoints are loaded (pickle "
                             ".ckpt files can run code: convert them to .safetensors)")
    if source.kind == "missing":
        raise ModelLoadError(path, "does not exist: it is not a folder, not a .safetensors "
                             "file and not a hub id (owner/name); check model.path")
    return source.kind  # type: ignore[return-value]  # folder, file or hub by now


def index_file(folder: str | Path) -> Path | None:
    """The folder's index (INDEX_FILES, the first there), or None."""
    return next((Path(folder) / name for name in INDEX_FILES
                 if (Path(folder) / name).is_file()), None)


def missing_local_path(path: str, workspace: str | Path | None = None) -> str | None:
    """Why `path` names a local folder or file that is not there, or None.

    A hub id is `owner/name`, so a value is taken for a local path when it cannot be one
    (starts with `.`, `~` or `/`, has a backslash or two slashes) or when its parent
    folder exists (`models/tiny-sd51` beside `models/tiny-sd15`): a typo there must say
    the folder is missing, not that a hub model is not cached.
    """
    if not path or model_source(path).built:
        return None
    base = Path(workspace).expanduser() if workspace is not None else Path.cwd()
    p = Path(path).expanduser()
    full = p if p.is_absolute() else base / p
    if full.exists() or (p.is_absolute() and p.exists()):
        return None
    looks_local = (path.startswith((".", "~", "/")) or "\\" in path
                   or path.count("/") > 1 or not HUB_ID.match(path))
    if not looks_local and not full.parent.is_dir():
        return None
    message = f"{full} does not exist (model.path looks like a local folder or file)"
    return message + _near_names(full)


def _near_names(full: Path) -> str:
    """'; did you mean ...' with the closest names in the parent folder, if any."""
    import difflib

    parent = full.parent
    if not parent.is_dir():
        return f"; its folder {parent} does not exist either"
    names = sorted(child.name for child in parent.iterdir() if not child.name.startswith("."))
    close = difflib.get_close_matches(full.name, names, n=3, cutoff=0.6)
    if close:
        return "; did you mean " + " or ".join(str(parent / n) for n in close) + "?"
    return f"; {parent} holds: {', '.join(names[:8]) or 'nothing'}"


# ---------------------------------------------------------------- the hub, offline first


def hub_reachable(timeout: float = 3.0) -> bool:
    """Whether the hub answers at all: a quick TCP connect instead of letting
    huggingface_hub retry for half a minute on a machine without network."""
    import socket
    from urllib.parse import urlparse

    if os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on"):
        return False
    url = urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co"))
    port = url.port or (443 if url.scheme == "https" else 80)
    try:
        with socket.create_connection((url.hostname or "huggingface.co", port), timeout):
            return True
    except OSError:
        return False


def hub_cached(repo_id: str) -> bool:
    """Whether the HF cache holds the hub model's index (model_index.json, or a modular
    pipeline's)."""
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:
        return False
    return any(isinstance(try_to_load_from_cache(repo_id, name), str) for name in INDEX_FILES)


def hub_error(path: str, what: str, exc: BaseException | None = None) -> ModelLoadError:
    """The message for a hub id that cannot be fetched: offline and not cached
    (exc None), or the hub's own refusal (private, gated, misspelt)."""
    if exc is None:
        return ModelLoadError(path, f"cannot download {what} of hub model {path!r}: no "
                              "network and not in the HF cache. Download it where there is "
                              "network (huggingface-cli download), or point model.path at a "
                              "local diffusers folder or .safetensors file")
    first = str(exc).splitlines()[0][:200] if str(exc) else ""
    return ModelLoadError(path, f"cannot download {what} of hub model {path!r} "
                          f"({type(exc).__name__}: {first}); check the id, and log in "
                          "(huggingface-cli login) for gated or private models")


def folder_class_name(path: str) -> str | None:
    """The pipeline class (`_class_name`) model_index.json names for `path`: a diffusers
    folder, or a hub id whose model_index.json is already in the local hub cache; None
    when there is none to read (a single file, tiny:, random:, an uncached id)."""
    import json

    kind = model_source(path).kind
    index: Path | None = index_file(path) if kind == "folder" else None
    if kind == "hub":
        try:
            from huggingface_hub import try_to_load_from_cache

            found = [try_to_load_from_cache(path, name) for name in INDEX_FILES]
            index = next((Path(f) for f in found if isinstance(f, str)), None)
        except Exception:  # noqa: BLE001 - no cache entry: nothing to read
            index = None
    try:
        return json.loads(index.read_text())["_class_name"] if index else None
    except (OSError, ValueError, KeyError):
        return None


def pipeline_class_or(path: str, wanted: str, default: str) -> str:
    """`wanted` where model.path `path` (a folder, or a hub id whose model_index.json is
    in the local hub cache) names that pipeline class, else `default`: the class a family
    with variants (image-to-video beside text-to-video) loads the folder with."""
    return wanted if folder_class_name(path) == wanted else default


def names_pipeline(path: str, pipeline: str, tiny_name: str) -> bool:
    """Whether model.path `path` is a `pipeline` model: its folder (or cached hub id)
    names that class, or it is `tiny:<tiny_name>`, the tiny model built as one. A
    family with variants (image-to-video beside text-to-video) tells them apart so."""
    source = model_source(path)
    if source.kind == "tiny":
        return source.name == tiny_name
    return folder_class_name(path) == pipeline


def safetensors_header(path: str) -> dict[str, Any]:
    """The JSON header of a .safetensors file: {name: {"dtype", "shape", ...}} per tensor,
    without "__metadata__" (no torch, no tensors read)."""
    import json
    import struct

    try:
        with open(path, "rb") as fh:
            (size,) = struct.unpack("<Q", fh.read(8))
            if size > 100_000_000:
                raise ValueError(f"header of {size} bytes")
            header = json.loads(fh.read(size))
    except (OSError, ValueError, struct.error) as exc:
        raise ModelLoadError(path, f"is not a readable .safetensors file ({exc}); "
                             "re-download it") from exc
    return {k: v for k, v in header.items() if k != "__metadata__"}

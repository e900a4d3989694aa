"""Where a memory estimate's model configs come from (`config_source`, by the kind
core/models/source.py gives model.path): a local diffusers folder (model_index.json, or a
modular-only model's modular_model_index.json); `random:<family>` the full-size configs in
core/models/families/<family>/full_size/; `tiny:<family>` the workspace's built tiny model,
or a throwaway build in a temporary folder (a check writes nothing to the workspace); a
hub id the HF cache only (a check downloads nothing); a single-file .safetensors its
family's full-size configs beside the file (model_counts.py reads its header)."""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path


class UnknownModel(Exception):
    """The configs cannot be read without a download or a build; the message says why."""


@dataclass
class ConfigSource:
    family: str
    folder: Path  # diffusers layout: model_index.json and <component>/config.json
    file: Path | None = None  # a single-file checkpoint: frozen sizes from its header


@contextlib.contextmanager
def config_source(path: str, family: str, workspace: Path) -> Iterator[ConfigSource]:
    """The folder of configs for model.path (resolved); raises UnknownModel."""
    from core.models.full_size import family_of, full_size_dir
    from core.models.source import model_source
    from core.models.tiny import tiny_family

    source, p = model_source(path), Path(path).expanduser()
    if source.kind == "tiny":
        with _tiny_folder(source.name, workspace) as folder:
            yield ConfigSource(tiny_family(source.name) or source.name, folder)
    elif source.kind == "random":
        yield ConfigSource(family_of(source.name), _config_folder(full_size_dir(source.name),
                                                      f"{path}: no full-size"))
    elif source.kind == "folder":
        yield ConfigSource(family, _config_folder(p, f"{path}: no"))
    elif source.kind == "file":
        from core.models.loading import detect_checkpoint_family, safetensors_keys

        found = detect_checkpoint_family(safetensors_keys(str(p))) or family
        arch = _config_folder(full_size_dir(found), f"{path} is a single file and there "
                              f"are no full-size {found} configs for its architecture:")
        yield ConfigSource(found, arch, file=p)
    else:
        from core.models.source import ModelLoadError, classify_source

        try:
            classify_source(path)  # a missing folder or file is not a hub id
        except ModelLoadError as exc:
            raise UnknownModel(f"{path} {exc.problem.message}") from None
        yield ConfigSource(family, _hub_folder(path))


def _config_folder(folder: Path, missing: str) -> Path:
    from core.models.source import index_file

    if index_file(folder) is None:  # a modular-only model's is modular_model_index.json
        raise UnknownModel(f"{missing} model_index.json in {folder}")
    return folder


def _hub_folder(repo_id: str) -> Path:
    """The cached snapshot of a hub model (its configs), without any download."""
    try:
        from huggingface_hub import try_to_load_from_cache

        from core.models.source import INDEX_FILES

        found = (try_to_load_from_cache(repo_id, name) for name in INDEX_FILES)
        cached = next((path for path in found if isinstance(path, str)), None)
    except Exception:  # noqa: BLE001 - an odd id or cache is simply not cached
        cached = None
    if not isinstance(cached, str):
        raise UnknownModel(f"hub model {repo_id} is not in the HF cache, and a check "
                           "downloads nothing")
    return Path(cached).parent


@contextlib.contextmanager
def _tiny_folder(name: str, workspace: Path) -> Iterator[Path]:
    """The workspace's built tiny model, else a build in a temporary folder, deleted
    afterwards: the check leaves the workspace as it was."""
    from core.models.tiny import TINY_SEED, tiny_builder, tiny_dir, tiny_is_built

    if tiny_is_built(name, workspace):
        yield tiny_dir(name, workspace)
        return
    import torch

    with tempfile.TemporaryDirectory(prefix=f"memory-estimate-tiny-{name}-") as tmp:
        with torch.random.fork_rng(devices=[]):  # the build seeds torch; keep the caller's
            tiny_builder(name)(Path(tmp), TINY_SEED)
        yield Path(tmp)

"""Directory-conflict checks: folders that must never be the same or nested.

A cache inside any dataset's images folder gets scanned as training data; two datasets
sharing a VAE cache overwrite each other's latents; a text cache beside latents mixes
files; an output folder inside a dataset feeds checkpoints back as images. Each of these
silently corrupts a run in other tools, so every pair is checked here, on real paths
(symlinks, `..`, relative forms and trailing slashes resolved), and reported with the
dataset id, both keys and both paths.

Pure apart from `os.path.realpath`, which reads symlinks but creates nothing.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from core.data.controls import CONTROL_KEYS
from core.data.entries import FolderLayout
from core.problems import Problem, error, warning

Relation = Literal["same", "inside", "contains"]


def real(path: str | Path) -> Path:
    return Path(os.path.realpath(os.path.expanduser(str(path))))


def relation(a: str | Path, b: str | Path) -> Relation | None:
    """How folder `a` relates to folder `b`: the same, inside it, containing it, or apart."""
    ra, rb = real(a), real(b)
    if ra == rb:
        return "same"
    if ra.is_relative_to(rb):
        return "inside"
    if rb.is_relative_to(ra):
        return "contains"
    return None


@dataclass(frozen=True)
class Folder:
    key: str  # "datasets.0.vae_cache"
    label: str  # "dataset 'shapes' vae_cache"
    path: str


def _describe(rel: Relation, a: Folder, b: Folder) -> str:
    verb = {"same": "is the same folder as", "inside": "is inside",
            "contains": "contains"}[rel]
    return f"{a.label} {a.path} {verb} {b.label} {b.path} ({b.key})"


def _pair(a: Folder, b: Folder, why: str, level: str = "error",
          either_way: bool = True) -> Problem | None:
    """A problem when `a` and `b` are the same or nested (`a` inside `b` only, unless
    `either_way`)."""
    rel = relation(a.path, b.path)
    if rel is None or (rel == "contains" and not either_way):
        return None
    make = error if level == "error" else warning
    return make(a.key, f"{_describe(rel, a, b)}; {why}")


def _folders(cfg: FolderLayout) -> tuple[list[Folder], list[Folder], Folder, Folder]:
    images, vae = [], []
    for i, ds in enumerate(cfg.datasets):
        images.append(Folder(f"datasets.{i}.images", f"dataset '{ds.id}' images", ds.images))
        vae.append(Folder(f"datasets.{i}.vae_cache", f"dataset '{ds.id}' vae_cache",
                          ds.vae_cache))
    text = Folder("text_cache.dir", "text cache", cfg.text_cache.dir)
    output = Folder("output.dir", "output folder", cfg.output.dir)
    return images, vae, text, output


def _missing_images(images: list[Folder]) -> list[Problem]:
    out = []
    for folder in images:
        path = real(folder.path)
        if not path.exists():
            out.append(error(folder.key, f"{folder.label} folder {folder.path} does not "
                                         "exist; create it or fix the path"))
        elif not path.is_dir():
            out.append(error(folder.key, f"{folder.label} {folder.path} is a file, not a "
                                         "folder"))
    return out


def check_directory_conflicts(cfg: FolderLayout) -> list[Problem]:
    """Every folder-pair rule. `cfg` must be resolved (absolute paths)."""
    images, vae, text, output = _folders(cfg)
    found: list[Problem | None] = []
    in_cache = "the output folder must not be or lie inside a cache; pick another"
    mixing = "cache files would be read as training images; move it outside"
    for img in images:
        # Every dataset's cache against every dataset's images, not only its own: B's
        # cache inside A's images is scanned as A's data (and cache clearing refuses it).
        found.extend(_pair(cache, img, mixing) for cache in vae)
        found.append(_pair(text, img, mixing))
    for img in images:
        found.append(_pair(output, img, "checkpoints and validation images would be read "
                                        "as training images; pick an output folder outside"))
    for i, a in enumerate(vae):
        for b in vae[i + 1:]:
            found.append(_pair(b, a, "two datasets would overwrite each other's latents; "
                                     "give each dataset its own vae_cache"))
        found.append(_pair(text, a, "text embeddings and latents must not share a folder; "
                                    "use separate folders"))
        found.append(_pair(output, a, in_cache, either_way=False))
    found.append(_pair(output, text, in_cache, either_way=False))
    for i, a in enumerate(images):
        for b in images[i + 1:]:
            found.append(_pair(b, a, "both datasets read these images (allowed, but they "
                                     "are sampled twice)", level="warning"))
    found.extend(_side_conflicts(cfg, images, vae, text))
    problems = [p for p in found if p is not None]
    return _missing_images(images) + _missing_side_folders(cfg) + problems


def _side_folders(cfg: FolderLayout) -> list[tuple[Folder, str]]:
    """Folders a dataset reads beside its images, with what they hold: loss masks, and an
    edit model's control images."""
    out = []
    for i, ds in enumerate(cfg.datasets):
        names = [("masks", "masks")] + [(name, "control images") for name in CONTROL_KEYS]
        out += [(Folder(f"datasets.{i}.{name}", f"dataset '{ds.id}' {name}",
                        getattr(ds, name)), what)
                for name, what in names if getattr(ds, name).strip()]
    return out


def _side_conflicts(cfg: FolderLayout, images: list[Folder], vae: list[Folder],
                    text: Folder) -> list[Problem | None]:
    """A masks or control folder equal to or inside an images folder would be scanned as
    training images; inside a cache it mixes with (and is cleared with) cache files."""
    found: list[Problem | None] = []
    for folder, what in _side_folders(cfg):
        found.extend(_pair(folder, img, f"the {what} would be read as training images; "
                                        f"move the {what} outside", either_way=False)
                     for img in images)
        found.extend(_pair(folder, cache, f"{what} must not live in a cache folder "
                                          "(clearing the cache would delete them); move "
                                          "them outside", either_way=False)
                     for cache in [*vae, text])
    return found


def _missing_side_folders(cfg: FolderLayout) -> list[Problem]:
    out = []
    for folder, what in _side_folders(cfg):
        path = real(folder.path)
        if not path.is_dir():
            state = "does not exist" if not path.exists() else "is a file, not a folder"
            fix = ("fix the path or clear the key to train unmasked" if what == "masks"
                   else "fix the path")
            out.append(error(folder.key, f"{folder.label} folder {folder.path} {state}; {fix}"))
    return out

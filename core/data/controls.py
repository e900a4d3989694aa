"""Paired datasets for edit models: each target image's control (source) images, from
datasets.N.control (and control_2, control_3 for multi-reference models).

Matching, as for loss masks (core/data/masks.py): the control of `<images>/sub/photo.jpg`
is `<control>/sub/photo.<any image extension>` (same relative folder, same file stem). A
target without all its controls is left out of training, and a control without a target
is unused; the check names both (the first few one by one, then a count). A control of
another size than its target is resized and cropped to the target's bucket
(`fit_control`), so a pair always trains at one shape.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from core.data.masks import mask_index, mask_key
from core.problems import Problem, warning

MAX_LISTED = 10
CONTROL_KEYS = ("control", "control_2", "control_3")  # dataset keys, in reference order


def split_controls(entry: str) -> list[str]:
    """One validation prompt's control images: validation.control_images entries hold
    several paths separated by "|" for a multi-reference model."""
    return [p.strip() for p in entry.split("|") if p.strip()]


def control_folders(ds: Any) -> list[str]:
    """The dataset's control folders in reference order (control, control_2, ...), up to
    the first empty key."""
    out = []
    for name in CONTROL_KEYS:
        value = getattr(ds, name)
        if not value.strip():
            break
        out.append(value)
    return out


def _listed(problems: list[Problem], key: str, lines: list[str], total: str) -> None:
    problems.extend(warning(key, line) for line in lines[:MAX_LISTED])
    if len(lines) > MAX_LISTED:
        problems.append(warning(key, f"{len(lines)} {total} (the first {MAX_LISTED} are "
                                     "listed above)"))


def match_controls(images_root: Path, folders: list[tuple[str, Path]], images: list[Path]
                   ) -> tuple[list[tuple[Path, ...] | None], list[Problem]]:
    """Each target's controls, one per (key, folder) in reference order, or None when one
    is missing (the target is left out); warnings naming the targets without a control
    and the controls without a target, against the folder's key ("datasets.0.control")."""
    found: list[list[Path] | None] = [[] for _ in images]
    problems: list[Problem] = []
    targets = {mask_key(images_root, p) for p in images}
    for key, root in folders:
        index = mask_index(root)
        missing = []
        for n, image in enumerate(images):
            control = index.get(mask_key(images_root, image))
            if control is None:
                missing.append(f"no control image for {image} (looked for "
                               f"{root / mask_key(images_root, image)}.png or another "
                               "image extension); it is left out of training")
                found[n] = None
            elif found[n] is not None:
                found[n].append(control)
        _listed(problems, key, missing, f"of {len(images)} images have no control image")
        unused = [f"{path} has no target image in {images_root}; it is not used"
                  for stem, path in sorted(index.items()) if stem not in targets]
        _listed(problems, key, unused, "control images have no target")
    return [tuple(f) if f is not None else None for f in found], problems


def fit_control(image: Any, bucket: tuple[int, int]) -> Any:
    """A control image (PIL RGB) resized to cover its target's bucket (width, height) and
    centre-cropped to it, as an HWC float32 array in [-1, 1] (what
    core.cache.build.load_pixels makes of the target)."""
    import numpy as np
    from PIL import Image

    width, height = bucket
    scale = max(width / image.width, height / image.height)
    scaled = (max(width, round(image.width * scale)), max(height, round(image.height * scale)))
    if image.size != scaled:
        image = image.resize(scaled, Image.Resampling.BICUBIC)
    left, top = (scaled[0] - width) // 2, (scaled[1] - height) // 2
    image = image.crop((left, top, left + width, top + height))
    return np.asarray(image, dtype=np.float32) / 127.5 - 1.0

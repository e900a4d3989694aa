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

from core.data.images import BadImage, load_rgb, read_header
from core.data.masks import mask_index, mask_key
from core.problems import Problem, error, warning

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


def readable_controls(found: list[tuple[Path, ...] | None], images: list[Path],
                      keys: list[str]) -> tuple[list[tuple[Path, ...] | None], list[Problem]]:
    """`found` with each target whose control header does not read set to None (left
    out, as the cache build would leave it), and a warning naming each such file against
    its folder's key in `keys` ("datasets.0.control", ...): the check says so before
    caching rather than in the build's log."""
    out: list[tuple[Path, ...] | None] = []
    bad: dict[str, list[str]] = {key: [] for key in keys}
    for image, controls in zip(images, found, strict=True):
        for key, control in zip(keys, controls or (), strict=False):
            try:
                read_header(control)
            except BadImage as exc:
                bad[key].append(f"{exc}; {image}, its target, is left out of training")
                controls = None
                break
        out.append(controls)
    problems: list[Problem] = []
    for key, lines in bad.items():
        _listed(problems, key, lines, "control images cannot be read")
    return out, problems


def validation_control_problems(entries: list[str], prompts: list[str]) -> list[Problem]:
    """validation.control_images (resolved paths), each decoded as validation will: a file
    that is missing or unreadable is an error naming the key, the entry and its prompt,
    found at check instead of at the run's first validation (after the model loaded and
    steps trained, with no checkpoint to resume from)."""
    out = []
    for n, entry in enumerate(entries):
        prompt = f" (prompt {n + 1}: {prompts[n]!r})" if n < len(prompts) else ""
        for path in split_controls(entry):
            if not Path(path).is_file():
                what = "is a folder" if Path(path).is_dir() else "does not exist"
                out.append(error("validation.control_images",
                                 f"entry {n + 1}{prompt}: {path} {what}; name an image "
                                 "file to edit, e.g. one of your control folder's"))
                continue
            try:
                load_rgb(path).close()
            except BadImage as exc:
                out.append(error("validation.control_images",
                                 f"entry {n + 1}{prompt}: {exc}"))
    return out


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


def fit_area(image: Any, resolution: int, multiple: int = 16) -> Any:
    """A validation control image (PIL) resized to about resolution² pixels, its aspect
    kept and each side a multiple of `multiple` (at least one): the area training fits
    controls to (their target's bucket), not the pipeline's own 1024x1024."""
    from PIL import Image

    scale = (resolution * resolution / (image.width * image.height)) ** 0.5
    size = (max(multiple, round(image.width * scale) // multiple * multiple),
            max(multiple, round(image.height * scale) // multiple * multiple))
    return image.resize(size, Image.Resampling.BICUBIC)

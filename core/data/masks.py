"""Loss masks (`datasets.N.masks`): which mask belongs to which image, and the mask as the
latent-resolution weight map the loss is multiplied by.

Matching: the mask of `<images>/sub/photo.jpg` is `<masks>/sub/photo.<any image
extension>` (same relative folder, same file stem; the extension is matched
case-insensitively). An image without a mask trains unmasked, as if its mask were all
white; the check names it (the first few one by one, then a count).

Geometry: a mask goes through exactly the resize and crop its image's latents went
through (`core.cache.build.load_pixels`: the same box, the same filter), so pixel (x, y)
of the cropped mask covers pixel (x, y) of the cropped image; then each latent cell takes
the mean of the pixels it covers (area pooling), so a latent cell half inside the white
area weighs one half. White (255) is 1 (learned), black 0 (ignored).

No torch at module level: the check imports `mask_index`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from core.data.images import IMAGE_EXTENSIONS, BadImage, load_rgb, read_header
from core.problems import Problem, warning

MAX_LISTED_NO_MASK = 10


def mask_key(root: Path, path: Path) -> str:
    """The relative path without its extension: what an image and its mask share."""
    relative = path.relative_to(root)
    return str(relative.parent / relative.stem)


def mask_index(masks_root: Path) -> dict[str, Path]:
    """Every mask file under `masks_root` by `mask_key` (the first in sorted order when a
    stem has two files); empty when the folder is missing (the conflict check names it)."""
    from core.data.scan import scan_images

    try:
        paths = scan_images(masks_root)
    except OSError:
        return {}
    out: dict[str, Path] = {}
    for path in paths:
        if path.suffix.lower() in IMAGE_EXTENSIONS:
            out.setdefault(mask_key(masks_root, path), path)
    return out


def match_masks(images_root: Path, masks_root: Path, images: list[Path], key: str
                ) -> tuple[list[Path | None], list[Problem]]:
    """Each image's mask (None: trains unmasked) and a warning per missing one, against
    `key` ("datasets.0.masks")."""
    index = mask_index(masks_root)
    found = [index.get(mask_key(images_root, p)) for p in images]
    missing = [p for p, m in zip(images, found, strict=True) if m is None]
    problems = [warning(key, f"no mask for {p} (looked for {masks_root / mask_key(images_root, p)}"
                             f".png or another image extension); it trains unmasked")
                for p in missing[:MAX_LISTED_NO_MASK]]
    if len(missing) > MAX_LISTED_NO_MASK:
        problems.append(warning(key, f"{len(missing)} of {len(images)} images have no mask "
                                     f"(the first {MAX_LISTED_NO_MASK} are listed above); "
                                     "they train unmasked"))
    return found, problems


def readable_masks(found: list[Path | None], images: list[Path], key: str
                   ) -> tuple[list[Path | None], list[Problem]]:
    """`found` with each mask whose header does not read set to None (its image trains
    unmasked, as the cache build would do), and a warning naming each, against `key`:
    said at check, where the user can still fix the file, not in the build's log."""
    out: list[Path | None] = []
    problems: list[Problem] = []
    for image, mask in zip(images, found, strict=True):
        if mask is not None:
            try:
                read_header(mask)
            except BadImage as exc:
                if len(problems) < MAX_LISTED_NO_MASK:
                    problems.append(warning(key, f"{exc}; {image} trains unmasked"))
                mask = None
        out.append(mask)
    return out, problems


def load_mask(mask: Path, image_size: tuple[int, int], box: tuple[int, int, int, int],
              bucket: tuple[int, int], latent_size: tuple[int, int]) -> Any:
    """The mask as a float [1, h, w] tensor in [0, 1] at latent size `latent_size` (h, w).

    image_size (width, height, after EXIF orientation): a mask of another size is first
    stretched to it, so it lines up with the image it belongs to. box and bucket are the
    image's VaeJob.box (scaled width, scaled height, left, top) and VaeJob.bucket.
    """
    import numpy as np
    import torch
    from PIL import Image

    grey = load_rgb(mask).convert("L")
    if grey.size != tuple(image_size):
        grey = grey.resize(tuple(image_size), Image.Resampling.BICUBIC)
    scaled_w, scaled_h, left, top = box
    if grey.size != (scaled_w, scaled_h):  # the image's own resize (core/cache/build.py)
        grey = grey.resize((scaled_w, scaled_h), Image.Resampling.BICUBIC)
    width, height = bucket
    grey = grey.crop((left, top, left + width, top + height))
    pixels = torch.from_numpy(np.asarray(grey, dtype=np.float32) / 255.0)
    pooled = torch.nn.functional.adaptive_avg_pool2d(pixels[None, None], tuple(latent_size))
    return pooled[0].clamp(0.0, 1.0)

"""Edit pairs as the UI shows them: a dataset item's control image(s) beside its target
in one thumbnail, and the validation control images of a run (one entry per prompt,
several paths in an entry separated by "|").

PIL is imported only when a thumbnail is drawn, so importing core.ops stays light.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from core.config import Config, resolved
from core.data.controls import split_controls
from core.ops.datasets import family_has

if TYPE_CHECKING:
    from PIL import Image

__all__ = ["edit_pair_thumbnail", "validation_controls"]

GAP = 6  # white pixels between the panels, so two similar pictures do not run together
BACKGROUND = (255, 255, 255)


def _panel(path: Path, height: int) -> Image.Image:
    """`path` scaled to `height` pixels high, EXIF orientation applied (a control and its
    target must look the way a viewer shows them, or a rotated photo looks unmatched)."""
    from PIL import Image, ImageOps

    with Image.open(path) as im:
        im.draft("RGB", (height, height))  # JPEG: decode at a reduced size
        im = ImageOps.exif_transpose(im).convert("RGB")
    width = max(1, round(im.width * height / im.height))
    return im.resize((width, height), Image.Resampling.BICUBIC)


def edit_pair_thumbnail(target: Path | str, controls: Sequence[Path | str],
                        height: int = 192) -> Image.Image | None:
    """The control image(s), then the target, side by side at `height` pixels high, in
    reference order (control, control_2, ...): for square images with one control, a
    picture about twice as wide as high. None when one of them cannot be read (the
    preview skips it, as it skips a bad image)."""
    from PIL import Image

    try:
        panels = [_panel(Path(p), height) for p in (*controls, target)]
    except (OSError, ValueError, Image.DecompressionBombError):
        return None
    width = sum(p.width for p in panels) + GAP * (len(panels) - 1)
    out = Image.new("RGB", (width, height), BACKGROUND)
    left = 0
    for panel in panels:
        out.paste(panel, (left, 0))
        left += panel.width + GAP
    return out


def validation_controls(cfg: Config, workspace: Path | str) -> list[list[Path]]:
    """Each validation prompt's control images (absolute; relative paths resolved against
    the workspace, as the trainer does), in prompt order; [] for a family that is not an
    edit family, whose trainer ignores validation.control_images."""
    if not family_has("edit", cfg.model.family):
        return []
    entries = resolved(cfg, workspace).validation.control_images
    return [[Path(p) for p in split_controls(entry)] for entry in entries]

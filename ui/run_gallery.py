"""The followed run's validation images as the Training tab shows them: the gallery's
items (newest first; a video family's videos in place of their images, an edit run's
control images first) and the prompt x step grid, from the watcher's snapshot. Only
files inside the workspace are served by path; others go as pixels (or are left out)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from core import ops
from ui import render
from ui.context import AppContext

if TYPE_CHECKING:
    from ui.run_views import Following

GALLERY_LIMIT = 60

__all__ = ["GALLERY_LIMIT", "gallery_items", "gallery_of", "grid_html"]


def gallery_items(ctx: AppContext, f: Following) -> tuple[int, list]:
    """The gallery's items, newest step first. Where a video family wrote the prompt's
    video beside its image (NN.mp4), the video takes the image's place: gr.Gallery shows
    an .mp4 path as a video (a play mark on the thumbnail; it plays when opened). An edit
    run's control images come first, one per prompt (`control_items`)."""
    version, images = ctx.watchers.get(f.run_dir).snapshot()
    return version, gallery_of(ctx, f, images)


def grid_html(ctx: AppContext, f: Following, images: list) -> str:
    """The validation grid of `images` (the watcher's): a row per prompt, a column per
    validation round (the first, the last and evenly spaced ones between, as
    validation/grid.png picks them); the images by URL from the workspace (one outside
    it is left blank)."""
    steps = ops.grid_steps(sorted({im.step for im in images}), render.GRID_COLUMNS)
    cells = {(im.index, im.step): "gradio_api/file=" + quote(str(im.path))
             for im in images if im.step in steps and in_workspace(ctx, im.path)}
    rows = max([len(f.prompts), *[im.index + 1 for im in images]])
    labels = [f.prompts[n] if n < len(f.prompts) else f"prompt {n + 1}" for n in range(rows)]
    return render.validation_grid_html(steps, labels, cells)


def gallery_of(ctx: AppContext, f: Following, images: list) -> list:
    """`gallery_items`' items of the watcher's `images`."""
    if f.control_items is None:
        f.control_items = control_items(ctx, f)
    items = list(f.control_items)
    for image in images[:GALLERY_LIMIT]:
        prompt = f.prompts[image.index] if image.index < len(f.prompts) else ""
        caption = f"step {image.step} · {prompt}" if prompt else f"step {image.step}"
        items.append((shown_media(ctx, image.path, image.video), caption))
    return items


def control_items(ctx: AppContext, f: Following) -> list:
    """What each validation prompt of an edit run edits: its control image(s), labelled
    "control: <prompt>" ("control 2: ..." for a multi-reference prompt's second), in
    prompt order, so the first row reads like the results' rows. A control file that
    is missing is left out (the check named it before the run started)."""
    items = []
    for n, paths in enumerate(f.controls):
        prompt = f.prompts[n] if n < len(f.prompts) else ""
        for k, path in enumerate(paths):
            which = "control" if len(paths) == 1 else f"control {k + 1}"
            if path.is_file():
                try:
                    items.append((servable(ctx, path), f"{which}: {prompt}" if prompt
                                  else which))
                except OSError:
                    continue  # unreadable: the gallery shows the results without it
    return items


def shown_media(ctx: AppContext, image: Path, video: Path | None) -> Any:
    """The video when there is one the server may serve (inside the workspace: a video
    cannot be sent as pixels), else the image."""
    if video is not None and in_workspace(ctx, video):
        return str(video)
    return servable(ctx, image)


def in_workspace(ctx: AppContext, path: Path) -> bool:
    return path.resolve().is_relative_to(ctx.workspace.resolve())


def servable(ctx: AppContext, path: Path) -> Any:
    """A path inside the workspace as is; anything else as pixels, never as a file path,
    so the server only ever serves files from the workspace."""
    if in_workspace(ctx, path):
        return str(path)
    from PIL import Image

    with Image.open(path) as im:
        return im.convert("RGB")

"""The Dataset tab's preview items: a thumbnail per image or clip sample (a clip by its
first sampled frame; an edit family's pair as its control image(s) beside the target, one
picture drawn by core.ops), sent as small in-memory images, and the labels that tell a
clip or a pair from an image."""

from __future__ import annotations

from pathlib import Path
from typing import Any

THUMB = 192


def thumbnail(path: Path) -> Any:
    from PIL import Image

    with Image.open(path) as im:
        im.draft("RGB", (THUMB, THUMB))  # JPEG: decode at a reduced size
        return _fit(im.convert("RGB"))


def _fit(im: Any) -> Any:
    im.thumbnail((THUMB, THUMB))
    return im.copy()


def thumbnails(items: list[Any]) -> list[Any | None]:
    """A thumbnail per item, None for a file that cannot be read (skipped, as a bad image
    always was). A clip shows its first sampled frame. The clips a page shows of one
    video are decoded in one pass: decoding runs from the video's start, so a pass per
    clip would decode its beginning again for each."""
    from core.ops import clip_frames, edit_pair_thumbnail

    wanted: dict[Path, list[int]] = {}
    for item in items:
        if item.frames:
            wanted.setdefault(item.path, []).append(item.frames[0])
    frames: dict[tuple[Path, int], Any] = {}
    for path, indices in wanted.items():
        decoded = clip_frames(path, indices) or []
        frames.update(zip(((path, i) for i in indices), decoded, strict=False))
    out: list[Any | None] = []
    for item in items:
        if item.frames:
            frame = frames.get((item.path, item.frames[0]))
            out.append(_fit(frame) if frame is not None else None)
            continue
        if item.controls:  # an edit pair: control(s) | target, each THUMB pixels high
            out.append(edit_pair_thumbnail(item.path, item.controls, THUMB))
            continue
        try:
            out.append(thumbnail(item.path))
        except OSError:
            out.append(None)
    return out


def clip_label(item: Any, several: bool) -> str:
    """What a clip's thumbnail says before its caption (a frame alone looks like an image);
    `several`: its video gives more than one sample, numbered from 1."""
    if not item.frames:
        return ""
    which = f"clip {item.clip + 1} · " if several else ""
    return f"▶ {which}{len(item.frames)} frames · "


def pair_label(item: Any) -> str:
    """What an edit pair's thumbnail says before its caption: which side is which."""
    if not item.controls:
        return ""
    count = len(item.controls)
    return f"{'control' if count == 1 else f'{count} controls'} | target · "


def item_name(item: Any, several: bool) -> str:
    """The captions table's name of an item: the file, and which of its video's clips."""
    return f"{item.path.name} (clip {item.clip + 1})" if item.frames and several \
        else item.path.name

"""The Dataset tab's preview items: a thumbnail per image or clip sample (a clip as an
animated GIF of its sampled frames, which plays in the gallery; an edit family's pair as
its control image(s) beside the target, one picture drawn by core.ops), sent as small
in-memory images, and the labels that tell a clip or a pair from an image."""

from __future__ import annotations

from pathlib import Path
from typing import Any

THUMB = 192
ANIMATED_FRAMES = 17  # at most this many frames of a clip play in its preview


def thumbnail(path: Path) -> Any:
    from PIL import Image

    with Image.open(path) as im:
        im.draft("RGB", (THUMB, THUMB))  # JPEG: decode at a reduced size
        return _fit(im.convert("RGB"))


def _fit(im: Any) -> Any:
    im.thumbnail((THUMB, THUMB))
    return im.copy()


def shown_frames(frames: tuple[int, ...]) -> list[int]:
    """The frames of a clip its preview plays: all, or ANIMATED_FRAMES evenly spaced."""
    if len(frames) <= ANIMATED_FRAMES:
        return list(frames)
    step = (len(frames) - 1) / (ANIMATED_FRAMES - 1)
    return [frames[round(i * step)] for i in range(ANIMATED_FRAMES)]


def animated(path: Path, indices: list[int], frames: list[Any], fps: float) -> str:
    """The clip's frames (thumbnails) as a looping GIF in the temp folder, which Gradio
    serves and the browser plays in the gallery; named by the source file, its mtime
    and the frames' `indices`, so a page shown again reuses it."""
    import hashlib
    import tempfile

    stamp = f"{path.resolve()}:{path.stat().st_mtime_ns}:{indices}:{fps}:{THUMB}"
    folder = Path(tempfile.gettempdir()) / "dt-clip-previews"
    folder.mkdir(parents=True, exist_ok=True)
    out = folder / f"{hashlib.sha1(stamp.encode()).hexdigest()[:20]}.gif"
    if not out.exists():
        from core.ops import write_gif

        write_gif(out, frames, fps)
    return str(out)


def thumbnails(items: list[Any], fps: float = 8.0) -> list[Any | None]:
    """A thumbnail per item, None for a file that cannot be read (skipped, as a bad image
    always was). A clip plays: its sampled frames as an animated GIF (`animated`, at
    `fps`). The clips a page shows of one video are decoded in one pass: decoding runs
    from the video's start, so a pass per clip would decode its beginning again."""
    from core.ops import clip_frames, edit_pair_thumbnail

    wanted: dict[Path, set[int]] = {}
    for item in items:
        if item.frames:
            wanted.setdefault(item.path, set()).update(shown_frames(item.frames))
    frames: dict[tuple[Path, int], Any] = {}
    for path, indices in wanted.items():
        ordered = sorted(indices)
        decoded = clip_frames(path, ordered) or []
        frames.update(zip(((path, i) for i in ordered), map(_fit, decoded), strict=False))
    out: list[Any | None] = []
    for item in items:
        if item.frames:
            indices = shown_frames(item.frames)
            played = [frames.get((item.path, i)) for i in indices]
            out.append(animated(item.path, indices, played, fps)
                       if played and all(f is not None for f in played) else None)
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

"""The video demo's dataset: coloured shapes crossing the frame, captioned with colour,
shape and direction, so a model has to read the caption to move the right shape the right
way (`--preset demo-video`)."""

from __future__ import annotations

import random
from pathlib import Path

from core.data.synthetic import COLORS, SHAPES, write_once
from core.data.video import DIRECTIONS, VIDEO_EXTENSIONS, write_synthetic_clip


def demo_clips(seed: int = 0) -> list[tuple[str, str, str]]:
    """(colour, shape, direction) of every clip, in a fixed shuffled order."""
    items = [(c, s, d) for c in COLORS for s in SHAPES for d in DIRECTIONS]
    random.Random(seed).shuffle(items)
    return items


def generate_demo_clips(folder: Path, size: int = 64, frames: int = 17, fps: float = 16,
                        seed: int = 0) -> int:
    """Write the demo clips (.mp4) and their `.txt` captions into `folder`; returns the
    clip count. Never touches a folder it did not make (synthetic.write_once)."""

    def write(tmp: Path) -> int:
        items = demo_clips(seed)
        for color, shape, direction in items:
            stem = f"{color}_{shape}_{direction}"
            made = write_synthetic_clip(tmp / f"{stem}.mp4", color=color, shape=shape,
                                        direction=direction, frames=frames, fps=fps,
                                        size=(size, size))
            (tmp / f"{stem}.txt").write_text(
                f"a {made.color} {made.shape} moving {made.direction}\n", encoding="utf-8")
        return len(items)

    return write_once(Path(folder), write, lambda f: sum(1 for p in f.iterdir()
                                                          if p.suffix in VIDEO_EXTENSIONS))

"""validation/grid.png: every validation prompt (rows) at a few validation rounds
(columns), the first round beside the last, so a run's progress is one picture.

Pure PIL on the PNGs already written; the trainer calls it after each validation round.
"""

from __future__ import annotations

import os
from pathlib import Path

from core.runs.folder import STEP_RE, RunFolder

MAX_COLUMNS = 6
LABEL_HEIGHT = 16
LABEL_WIDTH = 150
BACKGROUND = (255, 255, 255)
INK = (20, 20, 20)


def grid_steps(steps: list[int], max_columns: int = MAX_COLUMNS) -> list[int]:
    """The rounds to show: all when they fit, else the first, the last and evenly
    spaced ones between (the first is the before, the last the after)."""
    if len(steps) <= max_columns:
        return list(steps)
    picks = {round(i * (len(steps) - 1) / (max_columns - 1)) for i in range(max_columns)}
    return [steps[i] for i in sorted(picks)]


def _rounds(folder: RunFolder) -> dict[int, Path]:
    return {int(m.group(1)): p for p in folder.validation_rounds()
            if (m := STEP_RE.match(p.name))}


def write_validation_grid(run_dir: Path, prompts: list[str]) -> Path | None:
    """Write (atomically) and return validation/grid.png; None with fewer than two
    rounds or no prompts, when there is nothing to compare."""
    from PIL import Image, ImageDraw

    folder = RunFolder(run_dir)
    rounds = _rounds(folder)
    steps = grid_steps(sorted(rounds))
    if len(steps) < 2 or not prompts:
        return None
    cells = [[_open(rounds[step] / f"{row:02d}.png") for step in steps]
             for row in range(len(prompts))]
    side = max((im.width for row in cells for im in row if im is not None), default=64)
    grid = Image.new("RGB", (LABEL_WIDTH + side * len(steps),
                             LABEL_HEIGHT + side * len(prompts)), BACKGROUND)
    draw = ImageDraw.Draw(grid)
    for col, step in enumerate(steps):
        label = "before (step 0)" if step == 0 else f"step {step}"
        draw.text((LABEL_WIDTH + col * side + 4, 2), label, fill=INK)
    for row, prompt in enumerate(prompts):
        draw.text((4, LABEL_HEIGHT + row * side + side // 2 - 6), prompt[:24], fill=INK)
        for col, image in enumerate(cells[row]):
            if image is not None:
                grid.paste(image.resize((side, side)),
                           (LABEL_WIDTH + col * side, LABEL_HEIGHT + row * side))
    path = folder.validation_grid
    tmp = path.with_name(f".{path.name}.tmp")
    grid.save(tmp, format="PNG")
    os.replace(tmp, path)
    return path


def _open(path: Path):
    """The image, or None when that round has no image for the row (a prompt added on
    resume): the cell stays blank rather than failing the run."""
    from PIL import Image

    try:
        with Image.open(path) as image:
            return image.convert("RGB")
    except OSError:
        return None

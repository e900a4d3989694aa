"""validation/grid.png: every validation prompt (rows) at a few validation rounds
(columns), the first round beside the last, so a run's progress is one picture. A round
that wrote videos (NN.mp4 beside NN.png) shows a strip of frames per prompt.

PIL on the files already written; the trainer calls it after each validation round.
"""

from __future__ import annotations

from pathlib import Path

from core.files import atomic_path
from core.runs.folder import STEP_RE, RunFolder

MAX_COLUMNS = 6
LABEL_HEIGHT = 16
LABEL_WIDTH = 150
BACKGROUND = (255, 255, 255)
INK = (20, 20, 20)
STRIP_FRAMES = 5  # frames of a validation video shown side by side


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


def write_validation_grid(run_dir: Path, prompts: list[str],
                          control_images: list[str] | None = None) -> Path | None:
    """Write (atomically) and return validation/grid.png; None with fewer than two
    rounds or no prompts, when there is nothing to compare. An edit model's validation
    control images (one entry per prompt, paths separated by "|") come first in each
    row: control | before | after."""
    from PIL import Image, ImageDraw

    folder = RunFolder(run_dir)
    rounds = _rounds(folder)
    steps = grid_steps(sorted(rounds))
    if len(steps) < 2 or not prompts:
        return None
    cells = [[validation_picture(rounds[step] / f"{row:02d}.png") for step in steps]
             for row in range(len(prompts))]
    labels = ["before (step 0)" if step == 0 else f"step {step}" for step in steps]
    if control_images:
        cells = [[_controls_picture(control_images[row] if row < len(control_images)
                                    else ""), *cells[row]] for row in range(len(prompts))]
        labels.insert(0, "control")
    shown = [im for row in cells for im in row if im is not None]
    side = max((im.height for im in shown), default=64)
    wide = max((im.width * side // im.height for im in shown), default=side)
    grid = Image.new("RGB", (LABEL_WIDTH + wide * len(labels),
                             LABEL_HEIGHT + side * len(prompts)), BACKGROUND)
    draw = ImageDraw.Draw(grid)
    for col, label in enumerate(labels):
        draw.text((LABEL_WIDTH + col * wide + 4, 2), label, fill=INK)
    for row, prompt in enumerate(prompts):
        draw.text((4, LABEL_HEIGHT + row * side + side // 2 - 6), prompt[:24], fill=INK)
        for col, image in enumerate(cells[row]):
            if image is not None:
                grid.paste(image.resize((wide, side)),
                           (LABEL_WIDTH + col * wide, LABEL_HEIGHT + row * side))
    path = folder.validation_grid
    with atomic_path(path) as tmp:
        grid.save(tmp, format="PNG")
    return path


def validation_picture(path: Path):
    """What shows for validation image `path` (NN.png): the image, or, where the round
    wrote its video (NN.mp4), STRIP_FRAMES of its frames side by side, evenly spaced from
    the first to the last. None when that round has no image for the row (a prompt added
    on resume) or it cannot be read: the cell stays blank rather than failing the run."""
    from PIL import Image

    from core.data.images import BadImage

    video = path.with_suffix(".mp4")
    try:
        if video.is_file():
            return _frame_strip(video)
        with Image.open(path) as image:
            return image.convert("RGB")
    except (OSError, BadImage):
        return None


def _controls_picture(entry: str):
    """A prompt's control images side by side (None when none loads)."""
    from PIL import Image

    from core.data.controls import split_controls
    from core.data.images import BadImage, load_rgb

    images = []
    for path in split_controls(entry):
        try:
            images.append(load_rgb(path))
        except (OSError, BadImage):
            continue
    if not images:
        return None
    side = images[0].height
    scaled = [im.resize((max(1, im.width * side // im.height), side)) for im in images]
    strip = Image.new("RGB", (sum(im.width for im in scaled), side), BACKGROUND)
    left = 0
    for im in scaled:
        strip.paste(im, (left, 0))
        left += im.width
    return strip


def _frame_strip(video: Path):
    from PIL import Image

    from core.data.video import probe_clip, read_frames

    total = probe_clip(video).frames
    count = min(STRIP_FRAMES, total)
    picks = [round(i * (total - 1) / max(count - 1, 1)) for i in range(count)]
    frames = read_frames(video, picks)
    strip = Image.new("RGB", (sum(f.width for f in frames), frames[0].height))
    for i, frame in enumerate(frames):
        strip.paste(frame.convert("RGB"), (i * frames[0].width, 0))
    return strip

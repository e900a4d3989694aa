"""Videos as the UI shows them: a clip's frames for the dataset preview's thumbnails (and
the animated GIF of them it plays, written whole through core.files), and
the validation videos of a run (validation/step_NNNNNN/NN.mp4, written beside NN.png
by a video family when validation.frames > 1).

PyAV and PIL are imported only when a clip is decoded, so importing core.ops stays light.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from core.runs.folder import STEP_PREFIX, RunFolder

if TYPE_CHECKING:
    from PIL import Image

__all__ = ["clip_frames", "validation_videos", "write_gif"]


def clip_frames(path: Path | str, indices: Sequence[int]) -> list[Image.Image] | None:
    """Source frames `indices` of the clip at `path`, as displayed RGB images, decoded in
    one pass (so a page showing several clips of one video decodes it once); None when
    the clip cannot be read: the preview skips it as it skips a bad image."""
    from core.data.video import BadClip, read_frames

    try:
        return read_frames(path, list(indices))
    except BadClip:
        return None


def write_gif(path: Path, frames: Sequence[Image.Image], fps: float) -> Path:
    """`frames` as a looping animated GIF at `path`, written whole (core.files: a temp
    beside it, renamed into place). Two pages may write the same preview at once: each
    writes its own temp, and a copy already in place is kept."""
    from core.files import atomic_path, keep_first

    with atomic_path(path, unique=(f".{path.name}.", ".tmp"), swap=keep_first) as tmp:
        frames[0].save(tmp, format="GIF", save_all=True, append_images=list(frames[1:]),
                       loop=0, duration=max(20, round(1000 / fps)))
    return path


def validation_videos(run_dir: Path | str) -> list[Path]:
    """The run's finished validation videos, oldest step first (temp files excluded: the
    writer renames them into place)."""
    validation = RunFolder(Path(run_dir)).validation
    if not validation.is_dir():
        return []
    return sorted(validation.glob(f"{STEP_PREFIX}*/*.mp4"))

"""Finding the image files of a dataset folder, fast and without opening them.

Rules (documented for users in the dataset tab):
- recursive; results sorted, so every rank and every run sees the same order;
- extensions matched case-insensitively (IMG_0001.JPG counts);
- hidden files and folders (name starting with ".", e.g. .cache, macOS "._x.jpg") skipped;
- folders listed in `exclude` (the dataset's own VAE cache, say) skipped;
- symlinked folders followed once (a link loop cannot hang the scan).
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Iterable
from pathlib import Path

from core.data.images import IMAGE_EXTENSIONS
from core.data.video import VIDEO_EXTENSIONS
from core.problems import Problem, warning

# Image formats people often have that we do not read; counted so we can tell the user
# why their .heic photos were not picked up.
OTHER_IMAGE_EXTENSIONS = frozenset({
    ".gif", ".tif", ".tiff", ".heic", ".heif", ".avif", ".jxl", ".svg", ".psd", ".ico",
    ".jp2", ".dng", ".cr2", ".nef", ".arw", ".raw",
})


def _key(path: str | Path) -> str:
    return os.path.normcase(os.path.realpath(path))


def scan_images(
    folder: Path | str,
    exclude: Iterable[Path | str] = (),
    problems: list[Problem] | None = None,
    others: Counter[str] | None = None,
    clips: bool = False,
) -> list[Path]:
    """Every image file under `folder` (and, with `clips`, every video clip), sorted.

    Raises FileNotFoundError / NotADirectoryError when `folder` itself is unusable (the
    caller reports that against the config key). Subfolders that cannot be read are
    skipped and, when `problems` is given, reported there as warnings. When `others` is
    given it counts files with OTHER_IMAGE_EXTENSIONS, and video clips when they are not
    scanned (by lower-case extension).
    """
    wanted = frozenset(IMAGE_EXTENSIONS) | (frozenset(VIDEO_EXTENSIONS) if clips else frozenset())
    counted = OTHER_IMAGE_EXTENSIONS | (frozenset() if clips else frozenset(VIDEO_EXTENSIONS))
    root = Path(folder)
    if not root.is_dir():
        raise FileNotFoundError(root) if not root.exists() else NotADirectoryError(root)
    excluded = {_key(p) for p in exclude if str(p)}
    visited = {_key(root)}
    found: list[str] = []
    stack = [str(root)]
    while stack:
        current = stack.pop()
        try:
            with os.scandir(current) as entries:
                for entry in entries:
                    name = entry.name
                    if name.startswith("."):
                        continue
                    try:
                        is_dir = entry.is_dir()
                    except OSError:
                        continue
                    if is_dir:
                        key = _key(entry.path)
                        if key not in excluded and key not in visited:
                            visited.add(key)
                            stack.append(entry.path)
                        continue
                    ext = os.path.splitext(name)[1].lower()
                    if ext in wanted:
                        found.append(entry.path)
                    elif others is not None and ext in counted:
                        others[ext] += 1
        except OSError as exc:
            if current == str(root):
                raise
            if problems is not None:
                problems.append(warning(current, f"cannot read folder ({exc.strerror or exc}); "
                                                 "its images are skipped"))
    found.sort()
    return [Path(p) for p in found]

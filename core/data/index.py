"""Index of one dataset: its usable images with sizes and captions, and what is wrong.

`index_dataset` never raises for anything a user's files can cause and never writes to
disk (`--stage check` uses it). Bad images are skipped with a warning naming the file;
images without a caption are kept with an empty caption and a warning; a dataset with no
usable image at all is an error against `datasets.N.images`.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from core.data.captions import CaptionReader
from core.data.entries import DatasetEntry
from core.data.images import IMAGE_EXTENSIONS, BadImage, load_rgb, read_header
from core.data.scan import scan_images
from core.problems import Problem, error, errors, warning

# Per-image "no caption" warnings listed one by one before they are summed up in one line,
# so a 20,000-image folder without captions prints a dozen lines, not 20,000.
MAX_LISTED_NO_CAPTION = 10

_EXTENSIONS_TEXT = ", ".join(e.lstrip(".") for e in IMAGE_EXTENSIONS)


@dataclass(frozen=True, slots=True)
class ImageItem:
    path: Path
    width: int  # after the EXIF orientation
    height: int
    caption: str
    mask: Path | None = None  # datasets.N.masks: this image's loss mask, if it has one


@dataclass
class DatasetIndex:
    dataset_key: str  # "datasets.0"
    root: Path
    items: list[ImageItem] = field(default_factory=list)
    problems: list[Problem] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """True when there is no error (warnings are fine)."""
        return not errors(self.problems)


def _check_folder(root: Path, key: str) -> Problem | None:
    if not root.exists():
        return error(key, f"folder not found: {root}; check the path (relative paths are "
                          "resolved against the workspace)")
    if not root.is_dir():
        return error(key, f"{root} is a file, not a folder; point it at the folder of images")
    return None


def _scan(ds: DatasetEntry, root: Path, key: str, out: DatasetIndex) -> list[Path]:
    others: Counter[str] = Counter()
    exclude = [ds.vae_cache] if ds.vae_cache.strip() else []
    try:
        paths = scan_images(root, exclude=exclude, problems=out.problems, others=others)
    except OSError as exc:
        out.problems.append(error(key, f"cannot read folder {root} ({exc.strerror or exc})"))
        return []
    if others:
        listed = ", ".join(f"{n} {ext}" for ext, n in sorted(others.items()))
        out.problems.append(warning(key, f"ignored {listed} file(s) in {root}: not a supported "
                                         f"format ({_EXTENSIONS_TEXT}); convert them to use "
                                         "them"))
    if not paths:
        out.problems.append(error(key, f"no images found in {root} ({_EXTENSIONS_TEXT})"))
    return paths


def index_dataset(
    ds: DatasetEntry,
    dataset_key: str,
    verify: bool = False,
    progress: Callable[[int, int], None] | None = None,
) -> DatasetIndex:
    """Scan, size-check and caption every image of `ds` (whose paths are absolute).

    verify=False reads headers only (fast, for checks); verify=True also decodes every
    image fully so truncated files are caught before caching. `progress(done, total)` is
    called now and then for a progress bar.
    """
    key = f"{dataset_key}.images"
    root = Path(ds.images)
    out = DatasetIndex(dataset_key, root)
    if not ds.images.strip():
        out.problems.append(error(key, "is empty; set the folder of images"))
        return out
    folder_problem = _check_folder(root, key)
    if folder_problem:
        out.problems.append(folder_problem)
        return out
    paths = _scan(ds, root, key, out)
    if not paths:
        return out
    try:
        reader = CaptionReader(root, ds.caption, ds.instance_prompt)
    except ValueError as exc:  # unknown strategy: config validation names it too
        out.problems.append(error(f"{dataset_key}.caption", str(exc)))
        return out
    out.problems.extend(reader.problems)
    _index_images(paths, reader, verify, out, progress)
    out.problems.extend(reader.entries_without_image(paths))
    _attach_masks(ds, dataset_key, out)
    if not out.items:
        out.problems.append(error(key, f"no usable images in {root}: all {len(paths)} were "
                                       "skipped (see the warnings)"))
    return out


def _attach_masks(ds: DatasetEntry, dataset_key: str, out: DatasetIndex) -> None:
    """Each item's loss mask (core/data/masks.py); a missing masks folder is the conflict
    check's error, so nothing is matched here then."""
    if not ds.masks.strip() or not Path(ds.masks).is_dir() or not out.items:
        return
    from dataclasses import replace

    from core.data.masks import match_masks

    masks, problems = match_masks(out.root, Path(ds.masks), [i.path for i in out.items],
                                  f"{dataset_key}.masks")
    out.items = [replace(item, mask=m) for item, m in zip(out.items, masks, strict=True)]
    out.problems.extend(problems)


def _index_images(
    paths: list[Path],
    reader: CaptionReader,
    verify: bool,
    out: DatasetIndex,
    progress: Callable[[int, int], None] | None,
) -> None:
    no_caption = 0
    total = len(paths)
    for done, path in enumerate(paths, start=1):
        if progress is not None and (done % 64 == 0 or done == total):
            progress(done, total)
        try:
            header = read_header(path)
            width, height = header.width, header.height
            if verify:  # decode fully, keep nothing: memory stays flat
                with load_rgb(path) as im:
                    width, height = im.size
        except BadImage as exc:
            out.problems.append(exc.problem())
            continue
        caption, problem = reader.caption_for(path)
        if problem is not None:
            if caption:
                out.problems.append(problem)  # e.g. "not UTF-8": kept, worth a look
            else:
                no_caption += 1
                if no_caption <= MAX_LISTED_NO_CAPTION:
                    out.problems.append(problem)
        out.items.append(ImageItem(path, width, height, caption))
    if no_caption > MAX_LISTED_NO_CAPTION:
        out.problems.append(warning(
            f"{out.dataset_key}.images",
            f"{no_caption} of {total} images have no caption (the first "
            f"{MAX_LISTED_NO_CAPTION} are listed above); they train with an empty caption"))

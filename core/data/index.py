"""Index of one dataset: its usable images with sizes and captions, and what is wrong.

`index_dataset` never raises for anything a user's files can cause and never writes to
disk (`--stage check` uses it). Bad images are skipped with a warning naming the file;
for a video family (`video=True`) clips are items too, one per sample the dataset's
frames/fps/clips settings take from each (core/data/video.py); an unreadable clip, or
one too short for `frames`, is skipped with a warning naming it, as a bad image is;
images without a caption are kept with an empty caption and a warning; a dataset with no
usable image at all is an error against `datasets.N.images`.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

from core.data.captions import CaptionReader
from core.data.entries import DatasetEntry
from core.data.images import IMAGE_EXTENSIONS, BadImage, load_rgb, read_header
from core.data.scan import scan_images
from core.data.video import VIDEO_EXTENSIONS, BadClip, clip_sample_count, frame_indices, probe_clip
from core.problems import Problem, error, errors, warning

# Per-image "no caption" warnings listed one by one before they are summed up in one line,
# so a 20,000-image folder without captions prints a dozen lines, not 20,000.
MAX_LISTED_NO_CAPTION = 10

_EXTENSIONS_TEXT = ", ".join(e.lstrip(".") for e in IMAGE_EXTENSIONS)
_CLIPS_TEXT = ", ".join(e.lstrip(".") for e in VIDEO_EXTENSIONS)


@dataclass(frozen=True, slots=True)
class ImageItem:
    """One training sample: an image, or a clip's frames (video families)."""

    path: Path
    width: int  # after the EXIF orientation
    height: int
    caption: str
    mask: Path | None = None  # datasets.N.masks: this image's loss mask, if it has one
    frames: tuple[int, ...] = ()  # a clip's source frame indices; () for an image
    clip: int = 0  # which of the video's samples (datasets.N.clips = "uniform")
    controls: tuple[Path, ...] = ()  # an edit model's control images (datasets.N.control)
    fps: float = 0.0  # a clip's source frame rate (where its frames lie in its audio)


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


def _scan(ds: DatasetEntry, root: Path, key: str, out: DatasetIndex, video: bool) -> list[Path]:
    others: Counter[str] = Counter()
    exclude = [ds.vae_cache] if ds.vae_cache.strip() else []
    try:
        paths = scan_images(root, exclude=exclude, problems=out.problems, others=others,
                            clips=video)
    except OSError as exc:
        out.problems.append(error(key, f"cannot read folder {root} ({exc.strerror or exc})"))
        return []
    clips = Counter({ext: n for ext, n in others.items() if ext in VIDEO_EXTENSIONS})
    others -= clips
    if others:
        listed = ", ".join(f"{n} {ext}" for ext, n in sorted(others.items()))
        out.problems.append(warning(key, f"ignored {listed} file(s) in {root}: not a supported "
                                         f"format ({_EXTENSIONS_TEXT}); convert them to use "
                                         "them"))
    if clips:
        listed = ", ".join(f"{n} {ext}" for ext, n in sorted(clips.items()))
        trains = "model.family trains on images only: choose a video family"
        out.problems.append(
            warning(key, f"ignored {listed} video clip(s) in {root}: {trains} to use them")
            if paths else error(key, f"{root} holds {listed} video clip(s) and no images, "
                                     f"but {trains}, or point {key} at a folder of images"))
        if not paths:
            return []
    if not paths:
        kinds = f"{_EXTENSIONS_TEXT}, {_CLIPS_TEXT}" if video else _EXTENSIONS_TEXT
        out.problems.append(error(key, f"no {'images or clips' if video else 'images'} "
                                       f"found in {root} ({kinds})"))
    return paths


def index_dataset(
    ds: DatasetEntry,
    dataset_key: str,
    verify: bool = False,
    progress: Callable[[int, int], None] | None = None,
    video: bool = False,
) -> DatasetIndex:
    """Scan, size-check and caption every image of `ds` (whose paths are absolute), and
    with `video` (a video family) every clip.

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
    paths = _scan(ds, root, key, out, video)
    if not paths:
        return out
    try:
        reader = CaptionReader(root, ds.caption, ds.instance_prompt)
    except ValueError as exc:  # unknown strategy: config validation names it too
        out.problems.append(error(f"{dataset_key}.caption", str(exc)))
        return out
    out.problems.extend(reader.problems)
    _index_images(paths, reader, verify, out, progress, ds)
    out.problems.extend(reader.entries_without_image(paths))
    _attach_masks(ds, dataset_key, out)
    _attach_controls(ds, dataset_key, out)
    if not out.items:
        out.problems.append(error(key, f"no usable images in {root}: all {len(paths)} were "
                                       "skipped (see the warnings)"))
    return out


def _attach_masks(ds: DatasetEntry, dataset_key: str, out: DatasetIndex) -> None:
    """Each item's loss mask (core/data/masks.py); a missing masks folder is the conflict
    check's error, so nothing is matched here then."""
    if not ds.masks.strip() or not Path(ds.masks).is_dir() or not out.items:
        return
    from core.data.masks import match_masks, readable_masks

    images, key = [i.path for i in out.items], f"{dataset_key}.masks"
    masks, problems = match_masks(out.root, Path(ds.masks), images, key)
    masks, unreadable = readable_masks(masks, images, key)
    problems += unreadable
    out.items = [replace(item, mask=m) for item, m in zip(out.items, masks, strict=True)]
    out.problems.extend(problems)


def _attach_controls(ds: DatasetEntry, dataset_key: str, out: DatasetIndex) -> None:
    """Each item's control images (core/data/controls.py); items without all of them
    are left out. A missing control folder is the conflict check's error."""
    from core.data.controls import (
        CONTROL_KEYS,
        control_folders,
        match_controls,
        readable_controls,
    )

    folders = [(f"{dataset_key}.{name}", Path(folder)) for name, folder in
               zip(CONTROL_KEYS, control_folders(ds), strict=False)]
    if not folders or not all(f.is_dir() for _, f in folders) or not out.items:
        return

    images = [i.path for i in out.items]
    found, problems = match_controls(out.root, folders, images)
    found, unreadable = readable_controls(found, images, [k for k, _ in folders])
    problems += unreadable
    out.items = [replace(item, controls=c) for item, c in zip(out.items, found, strict=True)
                 if c is not None]
    out.problems.extend(problems)


def _index_images(
    paths: list[Path],
    reader: CaptionReader,
    verify: bool,
    out: DatasetIndex,
    progress: Callable[[int, int], None] | None,
    ds: DatasetEntry,
) -> None:
    no_caption = 0
    total = len(paths)
    for done, path in enumerate(paths, start=1):
        if progress is not None and (done % 64 == 0 or done == total):
            progress(done, total)
        items = _items_of(path, verify, ds, out)
        if not items:
            continue
        caption, problem = reader.caption_for(path)
        if problem is not None:
            if caption:
                out.problems.append(problem)  # e.g. "not UTF-8": kept, worth a look
            else:
                no_caption += 1
                if no_caption <= MAX_LISTED_NO_CAPTION:
                    out.problems.append(problem)
        out.items.extend(replace(item, caption=caption) for item in items)
    if no_caption > MAX_LISTED_NO_CAPTION:
        out.problems.append(warning(
            f"{out.dataset_key}.images",
            f"{no_caption} of {total} images have no caption (the first "
            f"{MAX_LISTED_NO_CAPTION} are listed above); they train with an empty caption"))


def _items_of(path: Path, verify: bool, ds: DatasetEntry, out: DatasetIndex
              ) -> list[ImageItem]:
    """The uncaptioned samples of one file: an image's one, or those `ds` takes from a
    clip; [] (reported in `out`) when the file is unusable."""
    if path.suffix.lower() in VIDEO_EXTENSIONS:
        return _clip_items(path, ds, out)
    try:
        header = read_header(path)
        width, height = header.width, header.height
        if verify:  # decode fully, keep nothing: memory stays flat
            with load_rgb(path) as im:
                width, height = im.size
    except BadImage as exc:
        out.problems.append(exc.problem())
        return []
    return [ImageItem(path, width, height, "")]


def _clip_items(path: Path, ds: DatasetEntry, out: DatasetIndex) -> list[ImageItem]:
    """The samples `ds` takes from the clip at `path`; [] (with a warning naming it) when
    it cannot be read or is too short for datasets.N.frames."""
    try:
        info = probe_clip(path)
    except BadClip as exc:
        out.problems.append(exc.problem())
        return []
    picks = frame_indices(info.frames, info.fps, ds.fps, ds.frames, ds.clips, ds.clip_count,
                          ds.clip_stride)
    if not picks:
        held = clip_sample_count(info.frames, info.fps, ds.fps)
        rate = f" at {ds.fps:g} fps" if ds.fps else ""
        out.problems.append(warning(str(path), f"has {held} frame(s){rate}, fewer than "
                                               f"{out.dataset_key}.frames = {ds.frames}; "
                                               "skipped"))
        return []
    return [ImageItem(path, info.width, info.height, "", frames=tuple(frames), clip=i,
                      fps=info.fps) for i, frames in enumerate(picks)]

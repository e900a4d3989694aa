"""Aspect-ratio buckets: which training size an image gets, and how it is resized and cropped.

Pure functions: no torch, no I/O, so the check stage can print the bucket histogram of a
dataset before anything heavy is imported.

Rules, in one place:
- Bucket sides are multiples of BUCKET_MULTIPLE (64 = the VAE's factor 8 times a patch or
  UNet down-sampling factor of 8), so every family's latents line up.
- The resolution is first rounded down to a multiple of 64 (`effective_resolution`;
  `check_resolution` says so to the user). The pixel budget is that resolution squared.
- With bucketing, the candidates are the *maximal* sizes: w x h multiples of 64 with
  w*h <= budget, aspect between 1:4 and 4:1, where neither side can grow by 64 without
  exceeding the budget. Smaller sizes of the same shape are never the better choice (they
  only throw pixels away), so leaving them out keeps every bucket at about resolution²
  pixels. The set is symmetric: if w x h is a bucket, so is h x w.
- An image gets the candidate whose aspect ratio is closest in log-ratio distance
  (|log(bucket aspect / image aspect)|, compared exactly with fractions); ties go to the
  larger area, then to the landscape one (only a square image can tie a mirrored pair).
- Without bucketing every image gets the square effective_resolution x effective_resolution.
- Resizing covers the bucket (scale = max(bw/w, bh/h)) and crops the overflow at the center
  or at a random offset; crop="none" resizes to the bucket exactly, which distorts the
  aspect a little with bucketing and a lot without it (`check_settings` warns).
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Iterable
from fractions import Fraction
from functools import lru_cache
from typing import NamedTuple

from core.problems import Problem, error, warning

BUCKET_MULTIPLE = 64
MAX_ASPECT = 4  # buckets range from 1:4 (portrait) to 4:1 (landscape)
CROPS = ("center", "random", "none")


class Bucket(NamedTuple):
    """A training size in pixels. A plain (width, height) tuple, so it can be a dict key
    and compares equal to `(width, height)`."""

    width: int
    height: int

    @property
    def area(self) -> int:
        return self.width * self.height

    @property
    def aspect(self) -> float:
        return self.width / self.height

    @property
    def label(self) -> str:
        return f"{self.width}x{self.height}"

    def __str__(self) -> str:
        return self.label


class CropBox(NamedTuple):
    """How to turn an image into its bucket: resize to scaled_width x scaled_height, then
    take the bucket-sized window at (left, top). SDXL's crop_top_left is (top, left)."""

    scaled_width: int
    scaled_height: int
    left: int
    top: int


def effective_resolution(resolution: int) -> int:
    """The resolution actually used: rounded down to a multiple of 64 (at least 64)."""
    if isinstance(resolution, bool) or not isinstance(resolution, int):
        raise ValueError(f"resolution must be an integer number of pixels, got {resolution!r}")
    if resolution < BUCKET_MULTIPLE:
        raise ValueError(
            f"resolution {resolution} is too small: it must be at least {BUCKET_MULTIPLE} "
            f"pixels (bucket sides are multiples of {BUCKET_MULTIPLE})"
        )
    return resolution // BUCKET_MULTIPLE * BUCKET_MULTIPLE


def check_resolution(resolution: int, where: str) -> list[Problem]:
    """Problems with a resolution setting, for the check stage (`where` is the config key)."""
    try:
        used = effective_resolution(resolution)
    except ValueError as exc:
        return [error(where, str(exc))]
    if used != resolution:
        return [warning(where, f"resolution {resolution} is not a multiple of "
                               f"{BUCKET_MULTIPLE}; {used} is used")]
    return []


def check_settings(bucketing: bool, crop: str, where: str) -> list[Problem]:
    """Problems with the crop/bucketing pair (`where` is the dataset's key, "datasets.0")."""
    if crop not in CROPS:
        return [error(f"{where}.crop", f"unknown crop {crop!r}; choose one of {', '.join(CROPS)}")]
    if crop == "none" and not bucketing:
        return [warning(f"{where}.crop", 'crop = "none" without bucketing squashes every image '
                        "to a square; turn bucketing on or use center/random crop")]
    return []


def within_sides(bucket: Bucket, min_side: int = 0, max_side: int = 0) -> bool:
    """Whether both sides lie in [min_side, max_side] (0: no limit on that end)."""
    low, high = min(bucket), max(bucket)
    return low >= min_side and (not max_side or high <= max_side)


@lru_cache(maxsize=64)
def _bucket_list(resolution: int, min_side: int = 0, max_side: int = 0) -> tuple[Bucket, ...]:
    side = effective_resolution(resolution)
    budget = side * side
    m = BUCKET_MULTIPLE
    found = []
    # Widths from the narrowest 1:4 portrait to the widest 4:1 landscape; for each width the
    # tallest height within budget. Keeping only those that are also maximal in width gives
    # a symmetric set (the maximality test is symmetric in w and h).
    for width in range(m, side * MAX_ASPECT + 1, m):
        height = budget // width // m * m
        if height < m:
            break
        if (width + m) * height <= budget:
            continue  # not maximal: a wider bucket of the same height fits
        if width > MAX_ASPECT * height or height > MAX_ASPECT * width:
            continue
        if within_sides(Bucket(width, height), min_side, max_side):
            found.append(Bucket(width, height))
    return tuple(sorted(found, key=lambda b: (Fraction(b.width, b.height), b.area)))


def bucket_list(resolution: int, min_side: int = 0, max_side: int = 0) -> list[Bucket]:
    """The candidate buckets at a resolution, portrait to landscape (deterministic);
    with `min_side`/`max_side` (datasets.N.bucket_min_side/bucket_max_side) only those
    whose sides lie between them (0: no limit), which narrows the aspect range."""
    return list(_bucket_list(resolution, min_side, max_side))


def check_sides(resolution: int, min_side: int, max_side: int, bucketing: bool,
                where: str) -> list[Problem]:
    """Problems with the bucket side limits of one dataset (`where`: "datasets.0"): a
    limit without bucketing is ignored, and limits that leave no bucket are an error."""
    if not min_side and not max_side:
        return []
    if not bucketing:
        key = f"{where}.bucket_{'min' if min_side else 'max'}_side"
        return [warning(key, "limits the aspect buckets, but bucketing is off: every image "
                             "trains at the square resolution; it is ignored")]
    if max_side and min_side > max_side:
        return [error(f"{where}.bucket_min_side", f"is {min_side}, above "
                                                 f"{where}.bucket_max_side ({max_side})")]
    try:
        found = _bucket_list(resolution, min_side, max_side)
    except ValueError:
        return []  # the resolution's own problem is reported with it
    if found:
        return []
    whole = _bucket_list(resolution)
    sides = f"{min(min(b) for b in whole)} to {max(max(b) for b in whole)}"
    key = f"{where}.bucket_{'max' if max_side else 'min'}_side"
    return [error(key, f"leaves no bucket at resolution {resolution} (bucket sides run "
                       f"{sides} px, in steps of {BUCKET_MULTIPLE}); widen the limits")]


def _validate_size(width: int, height: int) -> None:
    for name, value in (("width", width), ("height", height)):
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise ValueError(f"image {name} must be a positive integer, got {value!r}")


def _distance(bucket: Bucket, width: int, height: int) -> Fraction:
    """exp(|log(bucket aspect / image aspect)|), exact so that ties are real ties."""
    ratio = Fraction(bucket.width * height, bucket.height * width)
    return max(ratio, 1 / ratio)


def bucket_for(width: int, height: int, resolution: int, bucketing: bool = True,
               crop: str = "center", min_side: int = 0, max_side: int = 0) -> Bucket:
    """The bucket an image of width x height pixels trains at (among those within the
    side limits, `bucket_list`)."""
    _validate_size(width, height)
    if crop not in CROPS:
        raise ValueError(f"unknown crop {crop!r}; choose one of {', '.join(CROPS)}")
    if not bucketing:
        side = effective_resolution(resolution)
        return Bucket(side, side)
    return min(
        _bucket_list(resolution, min_side, max_side) or _bucket_list(resolution),
        key=lambda b: (_distance(b, width, height), -b.area, -b.width),
    )


def upscale_factor(width: int, height: int, bucket: Bucket) -> float:
    """How much the image is enlarged to cover the bucket (> 1 means upscaled)."""
    _validate_size(width, height)
    return max(bucket.width / width, bucket.height / height)


def is_upscaled(width: int, height: int, bucket: Bucket) -> bool:
    """True when the image is smaller than its bucket on some side, so training sees an
    enlarged (blurry) copy; the check stage reports these."""
    return upscale_factor(width, height, bucket) > 1.0


def crop_box(width: int, height: int, bucket: Bucket, crop: str = "center",
             rng: random.Random | None = None) -> CropBox:
    """Resize-then-crop plan for one image; `rng` is required for crop="random" (the caller
    owns the seed, there is no hidden global random state)."""
    _validate_size(width, height)
    if crop == "none":
        return CropBox(bucket.width, bucket.height, 0, 0)
    if crop not in CROPS:
        raise ValueError(f"unknown crop {crop!r}; choose one of {', '.join(CROPS)}")
    scale = upscale_factor(width, height, bucket)
    # Rounding can land one pixel short of the bucket; never below it.
    scaled_w = max(bucket.width, round(width * scale))
    scaled_h = max(bucket.height, round(height * scale))
    spare_w, spare_h = scaled_w - bucket.width, scaled_h - bucket.height
    if crop == "center":
        return CropBox(scaled_w, scaled_h, spare_w // 2, spare_h // 2)
    if rng is None:
        raise ValueError('crop = "random" needs an explicit rng (random.Random(seed))')
    return CropBox(scaled_w, scaled_h, rng.randint(0, spare_w), rng.randint(0, spare_h))


class ClipBucket(NamedTuple):
    """A video family's sample shape: a bucket and a frame count (1 for an image)."""

    width: int
    height: int
    frames: int

    @property
    def area(self) -> int:
        return self.width * self.height

    @property
    def label(self) -> str:
        return f"{self.width}x{self.height}, {self.frames} frame{'s' if self.frames > 1 else ''}"


def bucket_histogram(buckets: Iterable[tuple[int, ...]]
                     ) -> list[tuple[Bucket | ClipBucket, int]]:
    """Count images per bucket, portrait to landscape, then by area (then by frames:
    (width, height, frames) keys count clips per frame bucket)."""
    counts = Counter(ClipBucket(*b) if len(b) == 3 else Bucket(*b) for b in buckets)
    order = sorted(counts, key=lambda b: (Fraction(b.width, b.height), b.area, tuple(b)))
    return [(b, counts[b]) for b in order]


def format_histogram(histogram: list[tuple[Bucket | ClipBucket, int]],
                     bar_width: int = 30) -> list[str]:
    """Lines like "  512x512   : 120 ███████", bars scaled to the largest count (a
    non-empty bucket always shows at least one block)."""
    if not histogram:
        return []
    label_w = max(9, *(len(b.label) for b, _ in histogram))
    count_w = max(len(str(n)) for _, n in histogram)
    most = max(n for _, n in histogram) or 1
    lines = []
    for b, n in histogram:
        blocks = max(1, round(n * bar_width / most)) if n else 0
        lines.append(f"  {b.label:<{label_w}} : {n:>{count_w}} {'█' * blocks}")
    return lines

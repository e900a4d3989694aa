"""Reading image files safely: header-only size checks, full decodes, odd modes to RGB.

Every failure a user's file can cause becomes `BadImage(path, reason)`, whose message names
the file and says what to do ("cat.jpg: truncated image file (re-export or remove it)").
Callers skip such files and report them; nothing here lets a raw PIL traceback escape.

No torch here: the dataset check (`--stage check`) imports this module.
"""

from __future__ import annotations

import struct
import warnings
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from PIL import Image

from core.problems import Problem, warning

IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg", ".webp", ".bmp")

# Same as PIL's own hard limit (2 x Image.MAX_IMAGE_PIXELS): about 179 megapixels, e.g.
# 13,000 x 13,000. Larger files are refused as possible decompression bombs. We check it
# ourselves instead of changing PIL's global setting, so callers can pass a lower limit
# (a higher one has no effect: PIL refuses beyond this at open).
MAX_PIXELS = 178_956_970

# Modes we know how to turn into RGB correctly. LAB and HSV, for instance, would "convert"
# in PIL by copying channels, which gives wrong colours, so they are refused instead.
SUPPORTED_MODES = frozenset({
    "1", "L", "P", "RGB", "RGBA", "RGBX", "RGBa", "CMYK", "YCbCr", "LA", "La", "PA",
    "I", "F", "I;16", "I;16L", "I;16B", "I;16N",
})
_ALPHA_MODES = frozenset({"RGBA", "RGBa", "LA", "La", "PA"})
_HIGH_DEPTH_MODES = frozenset({"I", "F", "I;16", "I;16L", "I;16B", "I;16N"})

ORIENTATION_TAG = 0x0112
# EXIF orientation -> the transpose that makes the image upright (same table as
# PIL.ImageOps.exif_transpose). Orientations 5-8 swap width and height.
_TRANSPOSE = {
    2: Image.Transpose.FLIP_LEFT_RIGHT,
    3: Image.Transpose.ROTATE_180,
    4: Image.Transpose.FLIP_TOP_BOTTOM,
    5: Image.Transpose.TRANSPOSE,
    6: Image.Transpose.ROTATE_270,
    7: Image.Transpose.TRANSVERSE,
    8: Image.Transpose.ROTATE_90,
}

# What a damaged file can make PIL's decoders raise. UnidentifiedImageError is an OSError.
_DECODE_ERRORS = (OSError, SyntaxError, ValueError, EOFError, IndexError, struct.error,
                  zlib.error, Image.DecompressionBombError)

_SUPPORTED_HINT = "PNG, JPEG, WEBP or BMP"


class BadImage(Exception):
    """A file that cannot be used as a training image; the message names it and the fix."""

    def __init__(self, path: Path | str, reason: str):
        self.path = Path(path)
        self.reason = reason
        super().__init__(f"{self.path}: {reason}")

    def problem(self) -> Problem:
        """The warning a dataset check prints: bad files are skipped, never fatal."""
        return warning(str(self.path), f"{self.reason}; skipped")


@dataclass(frozen=True, slots=True)
class ImageHeader:
    path: Path
    width: int  # as displayed, i.e. after the EXIF orientation is applied
    height: int


@contextmanager
def _open(path: Path, max_pixels: int) -> Iterator[Image.Image]:
    """Open lazily (header only) and run every check that needs no pixel data."""
    try:
        size = path.stat().st_size
    except OSError as exc:
        raise BadImage(path, f"cannot read file ({exc.strerror or exc})") from None
    if size == 0:
        raise BadImage(path, "empty file (0 bytes); re-export it or remove it")
    try:
        with warnings.catch_warnings():
            # PIL warns between its soft and hard limits; we apply our own limit below.
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            im = Image.open(path)
    except Image.DecompressionBombError:
        raise BadImage(path, _bomb_reason(None, max_pixels)) from None
    except Image.UnidentifiedImageError:
        raise BadImage(path, f"not an image file, or its header is damaged; convert it to "
                             f"{_SUPPORTED_HINT} or remove it") from None
    except PermissionError as exc:
        raise BadImage(path, f"cannot read file ({exc.strerror})") from None
    except _DECODE_ERRORS as exc:
        raise BadImage(path, _damaged_reason(exc, "header")) from None
    with im:
        width, height = im.size
        if width * height > max_pixels:
            raise BadImage(path, _bomb_reason((width, height), max_pixels))
        if width < 1 or height < 1:
            raise BadImage(path, f"image has no pixels ({width}x{height}); remove it")
        if im.mode not in SUPPORTED_MODES:
            raise BadImage(path, f"unsupported colour mode {im.mode} ({im.format}); "
                                 f"save it as an RGB {_SUPPORTED_HINT}")
        yield im


def _bomb_reason(size: tuple[int, int] | None, max_pixels: int) -> str:
    limit = f"the {max_pixels / 1e6:.0f}-megapixel safety limit"
    what = f"{size[0]}x{size[1]} pixels is over {limit}" if size else f"over {limit}"
    return f"{what} (possible decompression bomb); downscale it or remove it"


def _orientation(im: Image.Image) -> int:
    """EXIF orientation 1-8, 1 when absent or unreadable.

    For PNG, `getexif()` would decode the whole file when the eXIf chunk is not already
    known, so the header read only looks at what the header gave us.
    """
    if im.format == "PNG" and "exif" not in im.info:
        return 1
    try:
        value = int(im.getexif().get(ORIENTATION_TAG, 1))
    except Exception:  # a damaged EXIF block must not make a fine image unusable
        return 1
    return value if value in _TRANSPOSE else 1


def read_header(path: Path | str, max_pixels: int = MAX_PIXELS) -> ImageHeader:
    """Size after EXIF orientation, read from the header only (fast; no pixel decode).

    Raises BadImage for empty files, non-images, over-large images and unsupported modes.
    A file whose pixel data is truncated passes here; `verify_image`/`load_rgb` catch it.
    """
    path = Path(path)
    with _open(path, max_pixels) as im:
        width, height = im.size
        if _orientation(im) >= 5:
            width, height = height, width
        return ImageHeader(path, width, height)


def load_rgb(path: Path | str, max_pixels: int = MAX_PIXELS) -> Image.Image:
    """Decode fully, apply the EXIF orientation and return an RGB image.

    Odd but valid modes are converted: CMYK, 16-bit and float grey (scaled to 8 bits),
    palette, 1-bit, and anything with transparency (composited onto white).
    Truncated or corrupt pixel data raises BadImage.
    """
    path = Path(path)
    with _open(path, max_pixels) as im:
        try:
            im.load()
        except _DECODE_ERRORS as exc:
            raise BadImage(path, _damaged_reason(exc, "data")) from None
        rgb = to_rgb(im)
        transpose = _TRANSPOSE.get(_orientation(im))
    return rgb.transpose(transpose) if transpose is not None else rgb


def _damaged_reason(exc: BaseException, part: str) -> str:
    text = str(exc)
    if "truncated" in text.lower():
        return "truncated image file (re-export it or remove it)"
    return f"damaged image {part} ({text or type(exc).__name__}); re-export it or remove it"


def to_rgb(im: Image.Image) -> Image.Image:
    """RGB version of a loaded image of any mode in SUPPORTED_MODES."""
    if im.mode == "RGB":
        return im.copy()  # the caller's file handle closes; hand back an independent image
    if im.mode in _HIGH_DEPTH_MODES:
        return _high_depth_to_l(im).convert("RGB")
    if im.mode in _ALPHA_MODES or "transparency" in im.info:
        rgba = im.convert("RGBA")
        out = Image.new("RGB", im.size, (255, 255, 255))
        out.paste(rgba, mask=rgba.getchannel("A"))
        return out
    return im.convert("RGB")  # 1, L, P, CMYK, YCbCr, RGBX


def _high_depth_to_l(im: Image.Image) -> Image.Image:
    """Scale 16-bit / 32-bit / float grey to 8 bits by its apparent range.

    PIL's own convert clips such values at 255 (a 16-bit photo turns white), so we scale:
    values within 0-1 (float) are taken as 0-1, within 0-255 as 8-bit, within 0-65535 as
    16-bit, anything wider is stretched from its own maximum.
    """
    import numpy as np  # only for these rare modes; keeps the check path's imports light

    arr = np.asarray(im.convert("I") if im.mode.startswith("I;16") else im, dtype=np.float64)
    hi = float(arr.max()) if arr.size else 0.0
    if im.mode == "F" and hi <= 1.0:
        scale = 255.0
    elif hi <= 255:
        scale = 1.0
    elif hi <= 65535:
        scale = 255.0 / 65535.0
    else:
        scale = 255.0 / hi
    out = np.clip(np.rint(arr * scale), 0, 255).astype(np.uint8)
    return Image.fromarray(out)


def verify_image(path: Path | str, max_pixels: int = MAX_PIXELS) -> Problem | None:
    """Fully decode the file; the problem a user should see, or None when it is usable."""
    try:
        load_rgb(path, max_pixels)
    except BadImage as exc:
        return exc.problem()
    return None

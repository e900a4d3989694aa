"""Reading and writing video clips (Wan video LoRA datasets, validation videos) with PyAV.

Every failure a user's file can cause becomes `BadClip(path, reason)`, whose message names
the file and says what to do; callers skip such clips and report them, as with BadImage.
No raw PyAV exception escapes.

Frames are indexed in decode (display) order: frame n is the n-th frame the decoder gives,
whatever its timestamp. Resampling to another frame rate uses the stream's average rate,
so a variable-rate phone video is treated as if it ran at its average rate.

`av` (and numpy) are imported inside the functions and there is no torch here: the dataset
check imports this module and must stay cheap.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import TYPE_CHECKING

from core.data.images import BadImage
from core.data.synthetic import BACKGROUNDS, COLORS, SHAPES
from core.files import atomic_path

if TYPE_CHECKING:
    import numpy as np
    from PIL import Image

VIDEO_EXTENSIONS = (".mp4", ".webm", ".mov", ".mkv")
# How a video becomes training clips (datasets.N.clips): "head" is musubi-tuner's name
# for "start".
CLIP_MODES = ("start", "head", "chunk", "slide", "uniform")
DIRECTIONS = ("left", "right", "up", "down")
# In order of preference. libx264 with yuv420p is what every browser plays; libopenh264 is
# H.264 too; mpeg4 (Part 2) always ships with FFmpeg but browsers do not play it.
ENCODERS = ("libx264", "libopenh264", "mpeg4")

_REENCODE = "re-encode it as H.264 .mp4 or remove it"


class BadClip(BadImage):
    """A file that cannot be used as a training clip; the message names it and the fix.
    A BadImage, so whatever skips and reports a bad image does the same with it."""


@dataclass(frozen=True, slots=True)
class ClipInfo:
    path: Path
    width: int  # as displayed: after the rotation and the pixel aspect ratio are applied
    height: int
    frames: int
    fps: float
    # False when the header had no frame count (WebM, MKV) and `frames` was estimated from
    # the duration; such an estimate can be a frame off. probe_clip(exact=True) counts.
    frames_exact: bool = True


def _av_errors() -> tuple[type[BaseException], ...]:
    """What a damaged or odd file can make PyAV raise (FFmpegError covers av's own)."""
    import av

    return (av.FFmpegError, OSError, ValueError, EOFError, MemoryError)


def _open(path: Path):
    """Open the container and its first video stream; BadClip for anything a file can do."""
    import av

    try:
        size = path.stat().st_size
    except OSError as exc:
        raise BadClip(path, f"cannot read file ({exc.strerror or exc})") from None
    if size == 0:
        raise BadClip(path, f"empty file (0 bytes); {_REENCODE}")
    try:
        container = av.open(str(path), "r")
    except (av.error.InvalidDataError, av.error.DemuxerNotFoundError):
        raise BadClip(path, f"not a video file, or its container is damaged; {_REENCODE}") \
            from None
    except _av_errors() as exc:
        raise BadClip(path, f"cannot open it ({exc}); {_REENCODE}") from None
    if not container.streams.video or container.streams.video[0].codec_context is None:
        container.close()
        what = "no decoder for its video codec" if container.streams.video else \
            "has no video stream (an audio file, or its header is damaged)"
        raise BadClip(path, f"{what}; {_REENCODE}")
    stream = container.streams.video[0]
    stream.thread_type = "AUTO"
    return container, stream


def _decode(path: Path, container, stream):
    """Decoded frames in display order; a decoder error becomes BadClip."""
    try:
        yield from container.decode(stream)
    except _av_errors() as exc:
        raise BadClip(path, f"cannot decode its video ({stream.codec_context.name}: "
                            f"{exc}); {_REENCODE}") from None


def _duration_s(container, stream) -> float | None:
    """The video stream's duration in seconds, from whatever the container records."""
    if stream.duration and stream.time_base:
        return float(stream.duration * stream.time_base)
    tag = stream.metadata.get("DURATION")  # Matroska/WebM write it per track, as HH:MM:SS.f
    if tag:
        try:
            h, m, s = tag.split(":")
            return int(h) * 3600 + int(m) * 60 + float(s)
        except ValueError:
            pass
    return container.duration / 1_000_000 if container.duration else None  # AV_TIME_BASE


def probe_clip(path: Path | str, exact: bool = False) -> ClipInfo:
    """Size, frame count and rate from the header, plus one decoded frame (fast).

    The first frame is decoded because PyAV exposes the rotation (phone videos) only on
    frames, and because it shows the codec can be decoded at all. The frame count is the
    header's when it has one (MP4, MOV); otherwise it is estimated as duration x fps, or
    counted by decoding when there is no duration or `exact` is set.

    Remembered per file (path, size, mtime): the UI's live check, the check and the cache
    plan probe every clip again and again, at about 7 ms per 832x480 clip. A changed file
    is probed anew; a clip that fails is not remembered.
    """
    path = Path(path)
    try:
        stat = path.stat()
    except OSError:
        return _probe(path, exact)  # raises BadClip naming the file
    return _probe_stamped(str(path), stat.st_size, stat.st_mtime_ns, exact)


@functools.lru_cache(maxsize=8192)
def _probe_stamped(path: str, size: int, mtime_ns: int, exact: bool) -> ClipInfo:
    return _probe(Path(path), exact)  # size and mtime_ns: a changed file is a new key


def _probe(path: Path, exact: bool) -> ClipInfo:
    container, stream = _open(path)
    with container:
        rate = stream.average_rate or stream.guessed_rate or stream.base_rate
        if not rate or rate <= 0:
            raise BadClip(path, f"its frame rate is unknown; {_REENCODE}")
        first = next(_decode(path, container, stream), None)
        if first is None:
            raise BadClip(path, f"its video stream holds no frames; {_REENCODE}")
        width, height = _to_image(path, first, stream.sample_aspect_ratio).size
        frames, counted = stream.frames, stream.frames > 0
        if not counted and not exact:
            seconds = _duration_s(container, stream)
            frames = round(seconds * float(rate)) if seconds else 0
    if frames <= 0 or (exact and not counted):
        frames, counted = _count_frames(path), True
    return ClipInfo(path, width, height, frames, float(rate), counted)


def _count_frames(path: Path) -> int:
    container, stream = _open(path)
    with container:
        return sum(1 for _ in _decode(path, container, stream))


def _step(source_fps: float, fps: float) -> float:
    """Source frames per output frame: 1 keeps every frame (fps = 0 keeps the source rate)."""
    if fps < 0 or (fps > 0 and source_fps <= 0):
        raise ValueError(f"cannot resample from {source_fps} fps to {fps} fps")
    return source_fps / fps if fps > 0 else 1.0


def _source_index(k: int, step: float) -> int:
    """Source frame shown as output frame k: round(k x source_fps / fps), halves rounded up."""
    return math.floor(k * step + 0.5)


def clip_sample_count(total: int, source_fps: float, fps: float) -> int:
    """How many frames a video of `total` source frames holds once resampled to `fps`."""
    step = _step(source_fps, fps)
    if total <= 0:
        return 0
    held = max(1, int((total - 0.5) / step))  # near the answer; float error fixed below
    while held > 1 and _source_index(held - 1, step) > total - 1:
        held -= 1
    while _source_index(held, step) <= total - 1:
        held += 1
    return held


def frame_indices(total: int, source_fps: float, fps: float, frames: int, clips: str,
                  count: int, stride: int = 1) -> list[list[int]]:
    """Source frame indices of each training clip of `frames` frames, resampled to `fps`.

    Output frame k of the resampled video is source frame round(k x source_fps / fps)
    (fps = 0 keeps every frame): 30 fps to 15 fps takes every other frame, 24 to 16 takes
    0, 2, 3, 5, 6, ... Which clips (`clips`): "start" (or "head") one from the beginning;
    "chunk" every whole window after another, from the beginning (a shorter rest is left
    out); "slide" a window starting every `stride` resampled frames; "uniform" `count`
    clips spread evenly, the first starting at frame 0 and the last ending at the video's
    end. Uniform clips may overlap but never share a start, so a video too short to hold
    `count` distinct starts gives fewer (one per possible start). Returns [] when the video
    holds fewer than `frames` resampled frames: the caller skips it and says so.
    """
    if frames < 1 or count < 1 or stride < 1:
        raise ValueError(f"frames, count and stride must be at least 1, got {frames}, "
                         f"{count} and {stride}")
    if clips not in CLIP_MODES:
        raise ValueError(f"clips must be one of {', '.join(CLIP_MODES)}, got {clips!r}")
    step = _step(source_fps, fps)
    held = clip_sample_count(total, source_fps, fps)
    if held < frames:
        return []
    return [[_source_index(s + j, step) for j in range(frames)]
            for s in clip_starts(held - frames, frames, clips, count, stride)]


def clip_starts(span: int, frames: int, clips: str, count: int, stride: int) -> list[int]:
    """The first resampled frame of each clip, `span` being the last possible start."""
    if clips == "chunk":
        stride = frames
    if clips in ("chunk", "slide"):
        return list(range(0, span + 1, stride))
    n = 1 if clips in ("start", "head") else min(count, span + 1)
    return [0] if n == 1 else [math.floor(i * span / (n - 1) + 0.5) for i in range(n)]


def read_frames(path: Path | str, indices: list[int]) -> list[Image.Image]:
    """Decode the given source frames as displayed RGB images, in one pass from the start.

    Indices may repeat and come in any order; the images come back in that order. Raises
    BadClip when the file is damaged or ends before the last index asked for.
    """
    path = Path(path)
    if not indices:
        return []
    if min(indices) < 0:
        raise ValueError(f"frame indices must be >= 0, got {min(indices)}")
    wanted, last = set(indices), max(indices)
    found: dict[int, Image.Image] = {}
    container, stream = _open(path)
    with container:
        sar = stream.sample_aspect_ratio
        decoded = 0
        for n, frame in enumerate(_decode(path, container, stream)):
            decoded = n + 1
            if n in wanted:
                found[n] = _to_image(path, frame, sar)
            if n >= last:
                break
    if last not in found:
        raise BadClip(path, f"video ends after {decoded} frames, but {last + 1} were needed "
                            f"(truncated file?); {_REENCODE}")
    return [found[i] for i in indices]


_ROTATE = {90: "ROTATE_90", 180: "ROTATE_180", 270: "ROTATE_270"}  # all counter-clockwise


def _to_image(path: Path, frame, sar: Fraction | None) -> Image.Image:
    from PIL import Image

    width = max(1, round(frame.width * sar)) if sar and sar != 1 else frame.width
    try:
        image = frame.to_image(width=width, height=frame.height)
    except _av_errors() as exc:
        raise BadClip(path, f"cannot convert a frame to RGB ({exc}); {_REENCODE}") from None
    turn = _ROTATE.get(round(frame.rotation) % 360)  # frame.rotation is counter-clockwise
    return image.transpose(getattr(Image.Transpose, turn)) if turn else image


def pick_encoder() -> str:
    """The first of ENCODERS this PyAV build has; RuntimeError naming the fix otherwise."""
    import av

    for name in ENCODERS:
        if name in av.codecs_available:
            return name
    raise RuntimeError(f"this PyAV build has none of the video encoders {', '.join(ENCODERS)}; "
                       "reinstall it with `pip install --force-reinstall av`")


def _as_array(frames: list[Image.Image] | np.ndarray) -> np.ndarray:
    """uint8 [F, H, W, 3], padded to even width and height by repeating the edge pixels.

    H.264 in yuv420p stores colour at half resolution and needs even sizes; repeating the
    last row/column keeps the picture unchanged apart from that one extra line.
    """
    import numpy as np

    if isinstance(frames, np.ndarray):
        array = frames
    else:
        array = np.stack([np.asarray(im.convert("RGB")) for im in frames]) if frames else None
    if array is None or array.ndim != 4 or array.shape[-1] != 3 or len(array) == 0:
        raise ValueError("write_video needs at least one frame: PIL images or uint8 [F,H,W,3]")
    if array.dtype != np.uint8:
        raise ValueError(f"write_video needs uint8 frames, got {array.dtype}")
    pad = ((0, 0), (0, array.shape[1] % 2), (0, array.shape[2] % 2), (0, 0))
    return np.pad(array, pad, mode="edge") if any(p[1] for p in pad) else array


def write_video(path: Path | str, frames: list[Image.Image] | np.ndarray, fps: float) -> Path:
    """Write an .mp4 a browser plays (H.264, yuv420p, index at the front), atomically.

    It is written to a temp file in the same folder and moved into place, so a reader (the
    UI gallery) never sees half a file. Odd sizes gain one edge row/column (see _as_array).
    """
    import av

    path = Path(path)
    if fps <= 0:
        raise ValueError(f"fps must be positive, got {fps}")
    array = _as_array(frames)
    rate = Fraction(fps).limit_denominator(1001)
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(path, unique=(f".{path.stem}.", ".mp4.tmp")) as tmp, \
            av.open(str(tmp), "w", format="mp4", options={"movflags": "+faststart"}) as out:
        # faststart (above) puts the index first, so a browser plays before the download ends
        stream = out.add_stream(pick_encoder(), rate=rate)
        stream.width, stream.height = array.shape[2], array.shape[1]
        stream.pix_fmt = "yuv420p"
        if stream.codec_context.name == "libx264":
            stream.options = {"crf": "18", "preset": "medium"}  # near-lossless to the eye
        for i, pixels in enumerate(array):
            frame = av.VideoFrame.from_ndarray(pixels, format="rgb24")
            frame.pts, frame.time_base = i, 1 / rate
            out.mux(stream.encode(frame))
        out.mux(stream.encode(None))
    return path


@dataclass(frozen=True, slots=True)
class SyntheticClip:
    color: str
    shape: str
    direction: str
    background: str
    boxes: tuple[tuple[int, int, int, int], ...]  # the shape's (left, top, right, bottom)

    @property
    def caption(self) -> str:
        return f"a {self.color} {self.shape} moving {self.direction} on a {self.background} " \
               "background"


def write_synthetic_clip(path: Path | str, color: str = "red", shape: str = "square",
                         direction: str = "right", frames: int = 17, fps: float = 16,
                         size: tuple[int, int] = (64, 64),
                         background: str = "white") -> SyntheticClip:
    """A shape crossing the frame edge to edge at constant speed: for tests and a video demo.

    The shape is a third of the shorter side, centred across the motion; `boxes` says where
    it is in each frame so a test can tell which frame it got.
    """
    from PIL import Image, ImageDraw

    for name, value, allowed in (("color", color, COLORS), ("shape", shape, SHAPES),
                                 ("direction", direction, DIRECTIONS),
                                 ("background", background, BACKGROUNDS)):
        if value not in allowed:
            raise ValueError(f"{name} must be one of {', '.join(allowed)}, got {value!r}")
    width, height = size
    side = min(width, height) // 3
    images, boxes = [], []
    for i in range(frames):
        along = i / max(frames - 1, 1)
        along = along if direction in ("right", "down") else 1 - along
        x, y = (width - side) // 2, (height - side) // 2  # centred, then moved along one axis
        if direction in ("left", "right"):
            x = round((width - side) * along)
        else:
            y = round((height - side) * along)
        image = Image.new("RGB", size, BACKGROUNDS[background])
        draw, fill, end = ImageDraw.Draw(image), COLORS[color], side - 1
        if shape == "circle":
            draw.ellipse((x, y, x + end, y + end), fill=fill)
        elif shape == "square":
            draw.rectangle((x, y, x + end, y + end), fill=fill)
        else:
            draw.polygon([(x + side / 2, y), (x, y + end), (x + end, y + end)], fill=fill)
        images.append(image)
        boxes.append((x, y, x + side, y + side))
    write_video(path, images, fps)
    return SyntheticClip(color, shape, direction, background, tuple(boxes))

"""Video clips: probing, fps resampling, clip selection, frame decoding and bad files.

Every clip here is a real file written with PyAV into tmp_path (tiny: 64x64, 9-33 frames).
"""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from core.data.synthetic import COLORS
from core.data.video import (
    BadClip,
    ClipInfo,
    clip_sample_count,
    frame_indices,
    probe_clip,
    read_frames,
    write_synthetic_clip,
    write_video,
)
from core.models.registry import get_family


def _centre(image: Image.Image, color: tuple[int, int, int], tol: int = 60) -> tuple[float, float]:
    """Centre of the pixels close to `color`: where the moving shape is in a decoded frame."""
    pixels = np.asarray(image, dtype=np.int32)
    mask = (np.abs(pixels - np.array(color)).sum(axis=-1) < tol)
    assert mask.sum() > 20, "the shape is missing from the frame"
    ys, xs = np.nonzero(mask)
    return float(xs.mean()), float(ys.mean())


def _box_centre(box: tuple[int, int, int, int]) -> tuple[float, float]:
    left, top, right, bottom = box
    return (left + right - 1) / 2, (top + bottom - 1) / 2


def _assert_frames_are(images, clip, indices, color):
    """Each decoded image shows the shape where `clip` drew it at that source index."""
    for image, index in zip(images, indices, strict=True):
        x, y = _centre(image, color)
        ex, ey = _box_centre(clip.boxes[index])
        assert abs(x - ex) < 1.0 and abs(y - ey) < 1.0, (index, (x, y), (ex, ey))


# ---------------------------------------------------------------- probe


def test_probe_mp4_reads_size_frames_and_fps(tmp_path: Path):
    path = tmp_path / "clip.mp4"
    write_synthetic_clip(path, frames=17, fps=16, size=(64, 48))
    info = probe_clip(path)
    assert info == ClipInfo(path, 64, 48, 17, 16.0, True)


def test_probe_is_remembered_until_the_file_changes(tmp_path: Path, monkeypatch):
    """The live check probes every clip on each change: the second probe decodes nothing,
    and a rewritten file is probed anew."""
    import os

    import core.data.video as video

    path = tmp_path / "a.mp4"
    write_synthetic_clip(path, frames=9, fps=16, size=(64, 48))
    first = probe_clip(path)
    opened, real = [], video._open
    monkeypatch.setattr(video, "_open", lambda p: opened.append(p) or real(p))
    assert probe_clip(path) == first and opened == []
    write_synthetic_clip(path, frames=5, fps=16, size=(32, 32))
    stat = path.stat()
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000))
    changed = probe_clip(path)
    assert (changed.frames, changed.width) == (5, 32) and len(opened) == 1


def test_probe_webm_estimates_frames_from_the_duration(tmp_path: Path):
    """WebM/MKV headers carry no frame count: it is estimated, or counted when asked."""
    import av

    path = tmp_path / "clip.webm"
    with av.open(str(path), "w") as out:
        stream = out.add_stream("libvpx-vp9", rate=30)
        stream.width, stream.height, stream.pix_fmt = 64, 64, "yuv420p"
        for i in range(21):
            pixels = np.full((64, 64, 3), i * 10, dtype=np.uint8)
            out.mux(stream.encode(av.VideoFrame.from_ndarray(pixels, format="rgb24")))
        out.mux(stream.encode(None))
    info = probe_clip(path)
    assert (info.frames, info.fps, info.frames_exact) == (21, 30.0, False)
    assert probe_clip(path, exact=True).frames_exact
    assert probe_clip(path, exact=True).frames == 21
    assert len(read_frames(path, [0, 20])) == 2


def test_probe_applies_rotation_and_pixel_aspect(tmp_path: Path):
    import av

    path = tmp_path / "phone.mp4"
    with av.open(str(path), "w") as out:
        stream = out.add_stream("libx264", rate=16)
        stream.width, stream.height, stream.pix_fmt = 64, 48, "yuv420p"
        stream.set_display_rotation(90)  # counter-clockwise, as a phone held upright writes
        for _ in range(5):
            pixels = np.zeros((48, 64, 3), dtype=np.uint8)
            pixels[:16, :16] = 255  # top-left marker
            out.mux(stream.encode(av.VideoFrame.from_ndarray(pixels, format="rgb24")))
        out.mux(stream.encode(None))
    info = probe_clip(path)
    assert (info.width, info.height) == (48, 64)
    (image,) = read_frames(path, [2])
    assert image.size == (48, 64)
    x, y = _centre(image, (255, 255, 255))
    assert x < 16 and y > 48  # turned a quarter counter-clockwise: top-left to bottom-left

    wide = tmp_path / "anamorphic.mp4"
    with av.open(str(wide), "w") as out:
        stream = out.add_stream("libx264", rate=16)
        stream.width, stream.height, stream.pix_fmt = 64, 48, "yuv420p"
        stream.codec_context.sample_aspect_ratio = Fraction(2, 1)
        out.mux(stream.encode(av.VideoFrame.from_ndarray(
            np.zeros((48, 64, 3), dtype=np.uint8), format="rgb24")))
        out.mux(stream.encode(None))
    assert (probe_clip(wide).width, probe_clip(wide).height) == (128, 48)
    assert read_frames(wide, [0])[0].size == (128, 48)


# ---------------------------------------------------------------- frame_indices


def test_resampling_30_to_15_fps_takes_every_other_frame():
    assert frame_indices(33, 30, 15, 9, "start", 1) == [[0, 2, 4, 6, 8, 10, 12, 14, 16]]
    assert clip_sample_count(33, 30, 15) == 17  # source frames 0, 2, ..., 32


def test_resampling_keeps_the_source_rate_at_fps_zero_and_rounds_uneven_steps():
    assert frame_indices(9, 24, 0, 5, "start", 1) == [[0, 1, 2, 3, 4]]
    assert clip_sample_count(9, 24, 0) == 9
    # 24 -> 16 fps: source index round(k * 1.5), halves up
    assert frame_indices(12, 24, 16, 5, "start", 1) == [[0, 2, 3, 5, 6]]
    assert clip_sample_count(12, 24, 16) == 8  # 0 2 3 5 6 8 9 11 (k=7: 10.5 rounds up)
    # upsampling repeats frames: 8 -> 16 fps
    assert frame_indices(3, 8, 16, 5, "start", 1) == [[0, 1, 1, 2, 2]]
    assert clip_sample_count(3, 8, 16) == 5  # k=5 -> round(2.5) = 3, past the end


def test_uniform_spreads_clips_from_start_to_end():
    clips = frame_indices(33, 30, 15, 5, "uniform", 3)  # 17 resampled frames
    assert clips == [[0, 2, 4, 6, 8], [12, 14, 16, 18, 20], [24, 26, 28, 30, 32]]
    assert frame_indices(33, 30, 15, 5, "start", 3) == [clips[0]]
    assert frame_indices(33, 30, 15, 5, "uniform", 1) == [clips[0]]


def test_uniform_gives_fewer_clips_when_the_video_cannot_hold_distinct_starts():
    clips = frame_indices(7, 16, 0, 5, "uniform", 4)  # starts 0, 1, 2 only
    assert clips == [[0, 1, 2, 3, 4], [1, 2, 3, 4, 5], [2, 3, 4, 5, 6]]
    assert frame_indices(5, 16, 0, 5, "uniform", 4) == [[0, 1, 2, 3, 4]]


def test_chunk_and_slide_cut_whole_windows_from_the_start():
    # 17 resampled frames (33 at 30 fps to 15), windows of 5
    assert [c[0] for c in frame_indices(33, 30, 15, 5, "chunk", 1)] == [0, 10, 20]
    assert [c[0] for c in frame_indices(33, 30, 15, 5, "slide", 1, stride=4)] == \
        [0, 8, 16, 24]
    assert frame_indices(33, 30, 15, 5, "head", 3) == frame_indices(33, 30, 15, 5, "start", 3)
    assert frame_indices(9, 16, 0, 9, "slide", 1, stride=3) == [list(range(9))]


def test_too_short_a_video_gives_no_clips():
    assert clip_sample_count(12, 30, 15) == 6
    assert frame_indices(12, 30, 15, 9, "start", 1) == []
    assert frame_indices(12, 30, 15, 9, "uniform", 3) == []
    assert frame_indices(0, 30, 0, 1, "start", 1) == []


def test_frame_indices_refuses_bad_arguments():
    with pytest.raises(ValueError, match="clips must be one of start, head, chunk, slide, uniform"):
        frame_indices(30, 30, 15, 5, "random", 1)
    with pytest.raises(ValueError):
        frame_indices(30, 30, 15, 0, "start", 1)


# ---------------------------------------------------------------- read_frames


def test_read_frames_returns_the_asked_frames_in_order(tmp_path: Path):
    path = tmp_path / "move.mp4"
    clip = write_synthetic_clip(path, color="blue", direction="right", frames=9, fps=16)
    indices = [8, 0, 3, 3, 5]
    images = read_frames(path, indices)
    assert all(im.mode == "RGB" and im.size == (64, 64) for im in images)
    _assert_frames_are(images, clip, indices, COLORS["blue"])


def test_read_frames_follows_resampled_indices(tmp_path: Path):
    path = tmp_path / "down.mp4"
    clip = write_synthetic_clip(path, color="green", direction="down", frames=33, fps=30)
    info = probe_clip(path)
    (first, last) = frame_indices(info.frames, info.fps, 15, 9, "uniform", 2)
    assert first == list(range(0, 17, 2)) and last == list(range(16, 33, 2))
    _assert_frames_are(read_frames(path, last), clip, last, COLORS["green"])


def test_synthetic_clip_says_what_it_drew(tmp_path: Path):
    clip = write_synthetic_clip(tmp_path / "a.mp4", color="yellow", shape="circle",
                                direction="left", frames=9, background="black")
    assert clip.caption == "a yellow circle moving left on a black background"
    assert clip.boxes[0][0] > clip.boxes[-1][0]  # moving left
    with pytest.raises(ValueError):
        write_synthetic_clip(tmp_path / "b.mp4", direction="sideways")


# ---------------------------------------------------------------- bad files


def _assert_bad(path: Path, *calls) -> list[BadClip]:
    """Each call raises BadClip naming the file (and nothing else)."""
    found = []
    for call in calls:
        with pytest.raises(BadClip) as info:
            call()
        assert str(info.value).startswith(f"{path}: ")
        problem = info.value.problem()
        assert problem.level == "warning" and problem.where == str(path)
        assert problem.message.endswith("; skipped")
        found.append(info.value)
    return found


def test_zero_byte_file_is_bad(tmp_path: Path):
    path = tmp_path / "empty.mp4"
    path.write_bytes(b"")
    (bad, _) = _assert_bad(path, lambda: probe_clip(path), lambda: read_frames(path, [0]))
    assert "empty file (0 bytes)" in bad.reason and "or remove it" in bad.reason


def test_missing_file_is_bad(tmp_path: Path):
    path = tmp_path / "gone.mp4"
    (bad,) = _assert_bad(path, lambda: probe_clip(path))
    assert "cannot read file" in bad.reason


def test_text_file_named_mp4_is_not_a_video(tmp_path: Path):
    path = tmp_path / "notes.mp4"
    path.write_text("shopping list: eggs, milk\n" * 20)
    (bad, _) = _assert_bad(path, lambda: probe_clip(path), lambda: read_frames(path, [0]))
    assert bad.reason == ("not a video file, or its container is damaged; re-encode it as "
                          "H.264 .mp4 or remove it")


def test_truncated_mp4_is_bad(tmp_path: Path):
    """The index is at the front (faststart), so the header survives and decoding ends early."""
    whole = tmp_path / "whole.mp4"
    rng = np.random.default_rng(0)  # noise: large frames, so half the bytes is half the video
    write_video(whole, rng.integers(0, 256, (24, 64, 64, 3), dtype=np.uint8), 16)
    path = tmp_path / "cut.mp4"
    data = whole.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    try:
        frames = probe_clip(path).frames
    except BadClip as exc:
        assert str(exc).startswith(f"{path}: ")
        frames = 24
    (bad,) = _assert_bad(path, lambda: read_frames(path, list(range(frames))))
    assert "truncated" in bad.reason or "cannot decode" in bad.reason


def test_damaged_middle_raises_only_badclip(tmp_path: Path):
    """Garbage inside the frame data: the decoder fails (BadClip) or conceals it, no crash."""
    whole = tmp_path / "whole.mp4"
    rng = np.random.default_rng(1)
    write_video(whole, rng.integers(0, 256, (24, 64, 64, 3), dtype=np.uint8), 16)
    data = bytearray(whole.read_bytes())
    start = len(data) // 3
    data[start:start + 2000] = b"\x55" * 2000
    path = tmp_path / "damaged.mp4"
    path.write_bytes(bytes(data))
    try:
        assert len(read_frames(path, list(range(24)))) == 24
    except BadClip as exc:
        assert str(exc).startswith(f"{path}: ") and exc.reason.endswith("or remove it")


def test_audio_only_file_has_no_video_stream(tmp_path: Path):
    import av

    path = tmp_path / "song.mp4"
    with av.open(str(path), "w") as out:
        stream = out.add_stream("aac", rate=44100)
        stream.layout = "mono"
        frame = av.AudioFrame.from_ndarray(np.zeros((1, 1024), np.float32), format="fltp",
                                           layout="mono")
        frame.sample_rate = 44100
        out.mux(stream.encode(frame))
        out.mux(stream.encode(None))
    (bad,) = _assert_bad(path, lambda: probe_clip(path))
    assert "has no video stream" in bad.reason


def test_asking_past_the_end_is_bad(tmp_path: Path):
    path = tmp_path / "short.mp4"
    write_synthetic_clip(path, frames=9)
    (bad,) = _assert_bad(path, lambda: read_frames(path, [0, 9]))
    assert bad.reason == ("video ends after 9 frames, but 10 were needed (truncated file?); "
                          "re-encode it as H.264 .mp4 or remove it")


# ---------------------------------------------------------------- write_video


def test_write_video_round_trips_frames_and_size(tmp_path: Path):
    path = tmp_path / "out" / "validation.mp4"
    frames = [Image.new("RGB", (64, 48), (i * 20, 0, 255 - i * 20)) for i in range(13)]
    assert write_video(path, frames, 16) == path
    assert probe_clip(path) == ClipInfo(path, 64, 48, 13, 16.0, True)
    assert [p.name for p in path.parent.iterdir()] == ["validation.mp4"]  # no temp left over
    decoded = read_frames(path, [0, 12])
    assert np.abs(np.asarray(decoded[1], dtype=int)[24, 32] - (240, 0, 15)).max() < 12


def test_write_video_pads_odd_sizes_and_takes_arrays(tmp_path: Path):
    path = tmp_path / "odd.mp4"
    write_video(path, np.zeros((5, 33, 47, 3), dtype=np.uint8), 29.97)
    info = probe_clip(path)
    assert (info.width, info.height, info.frames) == (48, 34, 5)
    assert info.fps == pytest.approx(29.97)


def test_write_video_refuses_nothing_to_write_and_leaves_no_file(tmp_path: Path):
    with pytest.raises(ValueError, match="at least one frame"):
        write_video(tmp_path / "none.mp4", [], 16)
    with pytest.raises(ValueError, match="uint8"):
        write_video(tmp_path / "none.mp4", np.zeros((2, 8, 8, 3), dtype=np.float32), 16)
    assert list(tmp_path.iterdir()) == []


# ---------------------------------------------------------------- frame counts


def test_wans_frame_rule_is_4k_plus_1():
    wan = get_family("wan").geometry
    assert [n for n in range(0, 22) if wan.valid_frames(n)] == [1, 5, 9, 13, 17, 21]
    assert wan.frames_hint(16).endswith("use 13 or 17")
    assert wan.frames_hint(18).endswith("use 17 or 21")
    assert wan.frames_hint(0).endswith("use 1")

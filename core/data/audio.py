"""A clip's audio track (the families whose geometry says `audio`: LTX-2), read with
PyAV: whether a clip has one, and the stretch of it under a sample's frames, resampled
to the rate the family's audio encoder takes.

Every failure a damaged audio stream can cause becomes `BadAudio(path, reason)`, whose
message names the file; callers train such a clip video-only and say so. A clip without
an audio stream is not an error: `has_audio` is False and `read_audio` gives None.
`write_audio_track` muxes a waveform into an existing .mp4 (validation videos of a family
that generates audio).

`av` and numpy are imported inside the functions: the dataset check imports this module.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

from core.data.images import BadImage
from core.data.video import _av_errors  # what a damaged file makes PyAV raise


class BadAudio(BadImage):
    """An audio stream that cannot be decoded; the clip itself may still train."""


def has_audio(path: Path | str) -> bool:
    """Whether the file holds an audio stream (from its header; False for a file that
    does not open: the clip check reports that)."""
    path = Path(path)
    try:
        stat = path.stat()
    except OSError:
        return False
    return _has_audio(str(path), stat.st_size, stat.st_mtime_ns)


@functools.lru_cache(maxsize=8192)
def _has_audio(path: str, size: int, mtime_ns: int) -> bool:  # size, mtime: a changed file
    import av

    try:
        with av.open(path, "r") as container:
            return bool(container.streams.audio)
    except _av_errors():
        return False


def read_audio(path: Path | str, start_s: float, duration_s: float,
               rate: int) -> Any | None:
    """The track from `start_s` for `duration_s` seconds as float32 [channels, samples]
    at `rate` (stereo kept, more channels mixed to stereo, mono left mono), zero-padded
    where the track ends early; None when the file has no audio stream. BadAudio for a
    stream that does not decode."""
    import av
    import numpy as np

    path = Path(path)
    try:
        with av.open(str(path), "r") as container:
            if not container.streams.audio:
                return None
            stream = container.streams.audio[0]
            layout = "mono" if stream.codec_context.channels == 1 else "stereo"
            resampler = av.AudioResampler(format="fltp", layout=layout, rate=rate)
            chunks = []
            for frame in container.decode(stream):
                chunks.extend(f.to_ndarray() for f in resampler.resample(frame))
            chunks.extend(f.to_ndarray() for f in resampler.resample(None))
    except _av_errors() as exc:
        raise BadAudio(path, f"its audio track cannot be decoded ({exc})") from None
    if not chunks:
        raise BadAudio(path, "its audio track holds no samples")
    track = np.concatenate(chunks, axis=1).astype(np.float32)
    first, count = round(start_s * rate), round(duration_s * rate)
    window = track[:, first:first + count]
    if window.shape[1] < count:
        window = np.pad(window, ((0, 0), (0, count - window.shape[1])))
    return np.ascontiguousarray(window)


def write_audio_track(video: Path | str, waveform: Any, rate: int) -> None:
    """Rewrite the .mp4 at `video` with `waveform` ([channels, samples] float in [-1, 1]
    at `rate`) as its AAC audio track, the video stream copied as it is; atomic."""
    import av
    import numpy as np

    from core.files import atomic_path

    video = Path(video)
    samples = np.clip(np.asarray(waveform, dtype=np.float32), -1.0, 1.0)
    layout = "mono" if samples.shape[0] == 1 else "stereo"
    with atomic_path(video, temp=video.name + ".tmp.mp4") as tmp, \
            av.open(str(video), "r") as source, \
            av.open(str(tmp), "w", format="mp4", options={"movflags": "+faststart"}) as out:
        # faststart, as write_video: the index first, so a browser plays before the end
        in_video = source.streams.video[0]
        out_video = out.add_stream_from_template(in_video)
        out_audio = out.add_stream("aac", rate=rate, layout=layout)
        for packet in source.demux(in_video):
            if packet.dts is not None:
                packet.stream = out_video
                out.mux(packet)
        frame = av.AudioFrame.from_ndarray(samples[:2], format="fltp", layout=layout)
        frame.sample_rate = rate
        for packet in out_audio.encode(frame):
            out.mux(packet)
        for packet in out_audio.encode(None):
            out.mux(packet)

"""LTX-2's audio in the data path, on tiny:ltx2 with tiny generated clips: a clip's track
read with PyAV at the audio VAE's rate, cut to its frames, cached beside the video latents
and trained; a clip without a track and one whose track does not decode train
video-only (the second named); the check counts clips with and without audio; the window
is in the entry's metadata; a family without audio ignores datasets.N.audio with a
warning; a validation video carries the generated audio track."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from core.data.audio import has_audio, read_audio, write_audio_track
from core.data.video import write_synthetic_clip

FRAMES, FPS = 9, 24.0


def tone(seconds: float, hz: float, rate: int = 44100) -> np.ndarray:
    t = np.arange(int(seconds * rate)) / rate
    return (0.4 * np.stack([np.sin(2 * np.pi * hz * t), np.sin(2 * np.pi * hz / 2 * t)])
            ).astype(np.float32)


def garbled_audio_clip(path: Path) -> None:
    """A clip whose AAC stream holds random bytes: its header says audio, nothing
    decodes."""
    import av

    write_synthetic_clip(path, frames=FRAMES, fps=FPS)
    tmp = path.with_name("tmp-" + path.name)
    rng = np.random.default_rng(0)
    with av.open(str(path)) as source, av.open(str(tmp), "w") as out:
        video = out.add_stream_from_template(source.streams.video[0])
        audio = out.add_stream("aac", rate=44100, layout="stereo")
        audio.codec_context.extradata = bytes([0x12, 0x10])  # AAC-LC, 44.1 kHz, stereo
        for packet in source.demux(source.streams.video[0]):
            if packet.dts is not None:
                packet.stream = video
                out.mux(packet)
        for i in range(10):
            packet = av.Packet(rng.integers(0, 256, 300, dtype=np.uint8).tobytes())
            packet.stream, packet.time_base = audio, audio.time_base
            packet.pts = packet.dts = i * 1024
            out.mux(packet)
    tmp.replace(path)


def clips_folder(folder: Path) -> Path:
    """a.mp4 with a tone, b.mp4 without audio, c.mp4 with a garbled audio stream."""
    folder.mkdir(parents=True)
    for name, color in (("a", "red"), ("b", "blue")):
        write_synthetic_clip(folder / f"{name}.mp4", color=color, frames=FRAMES, fps=FPS)
        (folder / f"{name}.txt").write_text(f"a {color} square moving right")
    write_audio_track(folder / "a.mp4", tone(FRAMES / FPS, 440.0), 44100)
    garbled_audio_clip(folder / "c.mp4")
    (folder / "c.txt").write_text("a red square, no sound")
    return folder


def audio_config(tmp_path: Path):
    from test_family_ltx2 import clip_config

    cfg = clip_config(tmp_path)
    cfg.datasets[0].images = str(clips_folder(tmp_path / "sounding"))
    return cfg


def top_level_boxes(path: Path) -> list[bytes]:
    """The MP4's top-level box types in file order (ftyp, moov, mdat, ...)."""
    data, at, boxes = path.read_bytes(), 0, []
    while at + 8 <= len(data):
        size = int.from_bytes(data[at:at + 4], "big")
        boxes.append(data[at + 4:at + 8])
        at += size if size >= 8 else len(data)
    return boxes


def test_a_track_is_read_at_the_asked_rate_and_cut_to_the_window(tmp_path: Path) -> None:
    path = tmp_path / "a.mp4"
    write_synthetic_clip(path, frames=24, fps=24)
    assert not has_audio(path) and read_audio(path, 0.0, 0.5, 16000) is None
    write_audio_track(path, tone(1.0, 440.0), 44100)
    assert has_audio(path)
    assert top_level_boxes(path).index(b"moov") < top_level_boxes(path).index(b"mdat"), \
        "the index first (faststart), so a browser plays before the whole file is in"
    window = read_audio(path, 0.25, 0.5, 16000)
    assert window.shape == (2, 8000) and window.dtype == np.float32
    assert 0.2 < float(np.abs(window).max()) < 0.6
    spectrum = np.abs(np.fft.rfft(window[0]))
    assert abs(float(np.argmax(spectrum)) * 16000 / 8000 - 440) < 10  # the tone, resampled
    tail = read_audio(path, 0.75, 0.5, 16000)  # past the end: zero-padded
    assert tail.shape == (2, 8000) and not tail[:, -1000:].any()


def test_the_check_counts_clips_with_and_without_audio(tmp_path: Path) -> None:
    from core.check import run_check

    cfg = audio_config(tmp_path)
    report = run_check(cfg, tmp_path, estimate=False)
    assert "2 clip(s) with audio, 1 without" in report.datasets[0].counted
    cfg.datasets[0].audio = "off"
    assert "with audio" not in run_check(cfg, tmp_path, estimate=False).datasets[0].counted


def test_a_family_without_audio_ignores_the_key_with_a_warning(tmp_path: Path) -> None:
    from conftest import small_config

    from core.config import validate_config

    cfg = small_config(tmp_path, images=1, family="wan")
    cfg.datasets[0].audio = "on"
    problems = [p for p in validate_config(cfg) if p.where == "datasets.0.audio"]
    assert [p.level for p in problems] == ["warning"] and "ignored" in problems[0].message


def test_the_entry_records_the_window_so_a_change_rebuilds_it(tmp_path: Path) -> None:
    from core.cache.plan import plan_caches

    cfg = audio_config(tmp_path)
    model = {"family": "ltx2", "fingerprint": "x"}
    jobs = {j.image.name: j for j in plan_caches(cfg, model).vae_jobs}
    assert jobs["a.mp4"].audio == (0.0, 0.375) and jobs["a.mp4"].meta["audio"] == "0.0,0.375"
    cfg.datasets[0].audio = "off"
    off = {j.image.name: j for j in plan_caches(cfg, model).vae_jobs}
    assert off["a.mp4"].audio is None and "audio" not in off["a.mp4"].meta
    cfg.datasets[0].audio, cfg.datasets[0].fps = "on", 48.0  # the same frames, half as long
    assert plan_caches(cfg, model).vae_jobs[0].meta["audio"] == "0.0,0.1875"


def test_a_run_caches_the_audio_beside_the_video_and_trains_both(
        tmp_path: Path, tiny_workspace: Path, capsys: pytest.CaptureFixture) -> None:
    from conftest import train_in_process
    from safetensors import safe_open

    from core.config import save_config

    cfg = audio_config(tmp_path)
    save_config(cfg, tmp_path / "run.toml")
    assert train_in_process(tmp_path / "run.toml", tiny_workspace) == 0
    keys = {}
    for name in ("a", "b", "c"):
        with safe_open(str(Path(cfg.datasets[0].vae_cache) / f"{name}.mp4.safetensors"),
                       "pt") as fh:
            keys[name] = {k: fh.get_slice(k).get_shape() for k in fh.keys()}  # noqa: SIM118
    assert keys["a"] == {"latents": [128, 2, 2, 2], "audio_latents": [9, 16]}
    assert keys["b"] == keys["c"] == {"latents": [128, 2, 2, 2]}
    assert "c.mp4" in capsys.readouterr().out  # named: its track did not decode
    run = Path(cfg.output.dir)
    assert (run / "lora/pytorch_lora_weights.safetensors").is_file()

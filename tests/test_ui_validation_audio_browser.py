"""The Training tab plays a validation video's sound (issue 39 item 5): an LTX-2 run's
validation/step_NNNNNN/NN.mp4 carries the generated audio as AAC, and the gallery's
player must play it unmuted. A followed live run's folder is given such a video, written
by the trainer's own writers (core.data.video.write_video, then
core.data.audio.write_audio_track, as core/train/validation.py writes it), so no training
runs; headless Chromium opens it in the gallery and plays it, and the page says the
element is not muted, has controls, and decodes audio bytes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from test_queue import fake_live_run
from test_ui_support import browser_page, running_app

pytestmark = pytest.mark.slow

RATE = 24000  # the LTX-2 vocoder's output rate
FPS, FRAMES = 24.0, 24  # one second of video


@pytest.fixture(scope="module")
def app(tmp_path_factory: pytest.TempPathFactory):
    with running_app(tmp_path_factory.mktemp("audio-ui") / "ws") as (ctx, url):
        yield ctx, url


def write_validation_video_with_sound(run_dir: Path) -> Path:
    """validation/step_000002/00.mp4 with a one-second 440 Hz AAC track, then 00.png (the
    trainer writes the video first, so a watcher that sees the PNG finds the video)."""
    from PIL import Image

    from core.data.audio import write_audio_track
    from core.data.video import write_video

    folder = run_dir / "validation/step_000002"
    ramp = np.linspace(0, 255, FRAMES).astype(np.uint8)
    frames = [Image.new("RGB", (64, 64), (int(v), 40, 255 - int(v))) for v in ramp]
    video = write_video(folder / "00.mp4", frames, FPS)
    t = np.arange(RATE) / RATE
    tone = (0.5 * np.sin(2 * np.pi * 440.0 * t)).astype(np.float32)
    write_audio_track(video, np.stack([tone, tone]), RATE)
    frames[0].save(folder / "00.png")
    return video


def test_the_validation_player_plays_the_videos_sound(app) -> None:
    import av
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    ctx, url = app
    run_dir, sleeper = fake_live_run(ctx.workspace, "sound")
    try:
        video = write_validation_video_with_sound(run_dir)
        with av.open(str(video)) as container:
            assert [s.codec_context.name for s in container.streams.audio] == ["aac"]
        with browser_page(url, args=("--autoplay-policy=no-user-gesture-required",)) as page:
            page.get_by_role("tab", name="Training").click()
            page.wait_for_function("(document.querySelector('#train-progress')?.innerText"
                                   " || '').includes('runs/sound')", timeout=30_000)
            thumb = page.locator("#validation-gallery .thumbnail-item").first
            thumb.wait_for(timeout=30_000)
            thumb.click()  # opens the preview, the player with controls
            player = "#validation-gallery [data-testid='detailed-video'] video, " \
                     "#validation-gallery video[data-testid='detailed-video']"
            page.wait_for_selector(player, timeout=15_000)
            state = page.evaluate("""s => { const v = document.querySelector(s);
                v.currentTime = 0; v.play();
                return {muted: v.muted, volume: v.volume, controls: v.controls,
                        src: v.currentSrc}; }""", player)
            assert state["muted"] is False and state["volume"] > 0, state
            assert state["controls"] is True and state["src"].endswith("00.mp4"), state
            try:
                page.wait_for_function(
                    "s => document.querySelector(s).webkitAudioDecodedByteCount > 0",
                    arg=player, timeout=15_000)
            except PlaywrightTimeout:
                played = page.evaluate("s => { const v = document.querySelector(s); return "
                                       "{time: v.currentTime, error: v.error?.message}; }",
                                       player)
                pytest.fail(f"the player decoded no sound in 15 s: {played}")
    finally:
        sleeper.kill()
        sleeper.wait()

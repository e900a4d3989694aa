"""A video family in the UI (issue 23): the Dataset tab's preview shows clips by their first
sampled frame, labelled as clips, and the Training tab's validation gallery shows a
step's NN.mp4 where the trainer wrote one. In-process: the view functions are called
directly, as the Gradio events call them."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

from conftest import write_shapes

from ui.preview_items import THUMB


def video_config(folder: str, **video):
    from core.config import Config, DatasetConfig, ModelConfig

    ds = DatasetConfig(id="clips", images=folder, vae_cache="cache/clips", **video)
    return Config(model=ModelConfig(family="wan", path="tiny:wan"), datasets=[ds])


def colour_at(image, xy: tuple[float, float]) -> tuple[int, int, int]:
    """The pixel at a fraction of the width and height."""
    return image.getpixel((int(xy[0] * (image.width - 1)), int(xy[1] * (image.height - 1))))


def near(colour: tuple[int, int, int], wanted: tuple[int, int, int], tol: int = 40) -> bool:
    return all(abs(a - b) <= tol for a, b in zip(colour, wanted, strict=True))


# ---------------------------------------------------------------- the dataset preview


def picture(thumb):
    """A preview item's picture: an image's thumbnail, or a clip's GIF's first frame."""
    from PIL import Image

    if isinstance(thumb, str | Path):
        with Image.open(thumb) as im:
            return im.convert("RGB")
    return thumb.convert("RGB")


def test_preview_shows_two_clips_by_their_first_frame_beside_an_image(tmp_path: Path, ctx,
                                                                      dataset_tab):
    from core.data.video import write_synthetic_clip
    from ui import tab_dataset

    folder = tmp_path / "data/clips"
    write_shapes(folder, 1, captions=["a still picture"])
    write_synthetic_clip(folder / "left.mp4", color="red", direction="right", frames=17)
    write_synthetic_clip(folder / "right.mp4", color="blue", direction="left", frames=17)
    (folder / "left.txt").write_text("a red square moving right", encoding="utf-8")
    (folder / "right.txt").write_text("a blue square moving left", encoding="utf-8")

    out = tab_dataset.preview_view(ctx, dataset_tab, video_config("data/clips"), 0)

    items, paths = out[dataset_tab.preview], out[dataset_tab.preview_paths]
    by_name = {Path(p).name: item for p, item in zip(paths, items, strict=True)}
    assert sorted(by_name) == ["img_000.png", "left.mp4", "right.mp4"]
    assert by_name["left.mp4"][1] == "▶ 17 frames · a red square moving right"
    assert by_name["right.mp4"][1] == "▶ 17 frames · a blue square moving left"
    still = next(v for k, v in by_name.items() if k.endswith(".png"))
    assert still[1] == "a still picture", "an image is not labelled as a clip"
    for thumb, _ in items:
        assert max(picture(thumb).size) <= THUMB
    # A clip plays (issue 40 item 9): an animated GIF of its 17 frames, the square moving.
    from PIL import Image

    with Image.open(by_name["left.mp4"][0]) as gif:
        assert gif.n_frames == 17
        first = picture(gif)
        gif.seek(16)
        assert near(colour_at(gif.convert("RGB"), (0.85, 0.5)), (220, 40, 40), tol=80)
    # The first frame: the red square at the left edge, the blue one at the right edge.
    red, blue = first, picture(by_name["right.mp4"][0])
    assert near(colour_at(red, (0.15, 0.5)), (220, 40, 40), tol=80)
    assert near(colour_at(red, (0.85, 0.5)), (255, 255, 255))
    assert near(colour_at(blue, (0.85, 0.5)), (40, 40, 220), tol=80)
    assert near(colour_at(blue, (0.15, 0.5)), (255, 255, 255))
    note = out[dataset_tab.preview_note]
    assert note.startswith("Samples 1-3 of 3 of `clips`") and "1 image(s), 2 clip(s)" in note
    assert ["left.mp4", "a red square moving right"] in out[dataset_tab.captions]


def test_preview_shows_each_clip_of_a_video_once_from_its_own_start(tmp_path: Path, ctx,
                                                                    dataset_tab):
    """clips = uniform: three samples of one video, each shown by its own first frame and
    numbered, all editing the video's one caption."""
    from core.data.video import write_synthetic_clip
    from ui import tab_dataset

    folder = tmp_path / "data/clips"
    folder.mkdir(parents=True)
    write_synthetic_clip(folder / "walk.mp4", color="green", direction="right", frames=33)
    cfg = video_config("data/clips", frames=5, fps=0.0, clips="uniform", clip_count=3)

    out = tab_dataset.preview_view(ctx, dataset_tab, cfg, 0)

    items = out[dataset_tab.preview]
    assert [caption for _, caption in items] == [
        f"▶ clip {n} · 5 frames · (no caption)" for n in (1, 2, 3)]
    assert out[dataset_tab.preview_paths] == [str(folder / "walk.mp4")] * 3
    assert [row[0] for row in out[dataset_tab.captions]] == [
        f"walk.mp4 (clip {n})" for n in (1, 2, 3)]
    # The square moves right: each clip's first frame has it further along.
    shown = [picture(t) for t, _ in items]
    greenest = [max(range(t.width), key=lambda x, t=t: t.getpixel((x, t.height // 2))[1]
                    - t.getpixel((x, t.height // 2))[0]) for t in shown]
    assert greenest[0] < greenest[1] < greenest[2], greenest


def test_a_clip_that_does_not_decode_is_skipped_and_clicks_still_pick_the_right_file(
        tmp_path: Path, ctx, dataset_tab, monkeypatch):
    from core import ops
    from core.data.video import write_synthetic_clip
    from ui import tab_dataset

    folder = tmp_path / "data/clips"
    folder.mkdir(parents=True)
    write_synthetic_clip(folder / "a.mp4", frames=17)
    write_synthetic_clip(folder / "b.mp4", frames=17)
    write_shapes(folder, 1)
    real = ops.clip_frames
    monkeypatch.setattr(ops, "clip_frames", lambda path, indices: None
                        if Path(path).name == "a.mp4" else real(path, indices))

    out = tab_dataset.preview_view(ctx, dataset_tab, video_config("data/clips"), 0)

    names = [Path(p).name for p in out[dataset_tab.preview_paths]]
    assert "a.mp4" not in names and "b.mp4" in names and len(names) == 2
    assert len(out[dataset_tab.preview]) == len(names), "a click's index picks its path"
    assert real(folder / "a.mp4", [0]) is not None  # the real one reads it
    (folder / "junk.mp4").write_text("not a video", encoding="utf-8")
    assert real(folder / "junk.mp4", [0]) is None


def test_an_image_family_ignores_clips_and_keeps_its_note(tmp_path: Path, ctx, dataset_tab):
    from core.config import Config, DatasetConfig
    from core.data.video import write_synthetic_clip
    from ui import tab_dataset

    folder = tmp_path / "data/mixed"
    write_shapes(folder, 2)
    write_synthetic_clip(folder / "clip.mp4", frames=5)
    cfg = Config(datasets=[DatasetConfig(id="m", images="data/mixed", vae_cache="cache/m")])

    out = tab_dataset.preview_view(ctx, dataset_tab, cfg, 0)

    assert out[dataset_tab.preview_note].startswith("Images 1-2 of 2 of `m`")
    assert all(p.endswith(".png") for p in out[dataset_tab.preview_paths])
    assert not any(caption.startswith("▶") for _, caption in out[dataset_tab.preview])


# ---------------------------------------------------------------- the validation gallery


def validation_round(run: Path, step: int, index: int, video: bool) -> tuple[Path, Path]:
    """NN.mp4 (when `video`), then NN.png: the order the trainer writes them in."""
    from PIL import Image

    from core.data.video import write_synthetic_clip

    folder = run / "validation" / f"step_{step:06d}"
    folder.mkdir(parents=True, exist_ok=True)
    png, mp4 = folder / f"{index:02d}.png", folder / f"{index:02d}.mp4"
    if video:
        write_synthetic_clip(mp4, frames=5)
    Image.new("RGB", (16, 16), "white").save(png)
    return png, mp4


def following(run: Path, prompts: list[str]):
    from core.ops import RunFollower
    from ui.run_views import Following

    return Following(RunFollower(run, log_offset=0), prompts)


def test_the_gallery_shows_a_steps_video_in_place_of_its_image(tmp_path: Path, ctx):
    import gradio as gr

    from ui.run_views import gallery_items

    run = tmp_path / "runs/wan"
    png, mp4 = validation_round(run, 2, 0, video=True)
    old_png, _ = validation_round(run, 0, 0, video=False)  # a round before videos, say

    _, items = gallery_items(ctx, following(run, ["a red square moving right"]))

    assert items == [(str(mp4), "step 2 · a red square moving right"),
                     (str(old_png), "step 0 · a red square moving right")]
    # Gradio sends an .mp4 path as a video item (the browser plays it), a .png as an image.
    shown = gr.Gallery().postprocess(items).root
    assert shown[0].video.path == str(mp4) and shown[0].video.mime_type == "video/mp4"
    assert shown[1].image.path == str(old_png)


def test_an_image_familys_gallery_still_shows_pngs(tmp_path: Path, ctx):
    from ui.run_views import gallery_items

    run = tmp_path / "runs/sd"
    first, _ = validation_round(run, 4, 0, video=False)
    second, _ = validation_round(run, 4, 1, video=False)

    _, items = gallery_items(ctx, following(run, ["one", "two"]))

    assert items == [(str(first), "step 4 · one"), (str(second), "step 4 · two")]


def test_a_run_outside_the_workspace_shows_its_image_as_pixels_not_its_video(
        tmp_path: Path):
    """Only workspace files are served; a video cannot be sent as pixels, so its image is."""
    from ui.context import AppContext
    from ui.run_views import gallery_items

    run = tmp_path / "elsewhere/run"
    validation_round(run, 2, 0, video=True)
    ctx = AppContext(tmp_path / "ws", monitor=False)
    try:
        _, items = gallery_items(ctx, following(run, []))
    finally:
        ctx.close()
    (media, caption), = items
    assert not isinstance(media, str) and media.size == (16, 16) and caption == "step 2"


def test_the_watcher_notices_a_video_that_comes_after_or_goes(tmp_path: Path):
    """The trainer writes the mp4 first; should one arrive (or vanish) after the image was
    seen, the gallery follows, by the observer's events or a rescan."""
    from ui.watch import GalleryWatcher

    run = tmp_path / "run"
    png, mp4 = validation_round(run, 2, 0, video=False)
    watcher = GalleryWatcher(run, rescan_s=3600).start()
    try:
        version, (item,) = watcher.snapshot()
        assert item.video is None
        shutil.copy(validation_round(tmp_path / "other", 2, 0, video=True)[1], mp4)
        deadline = time.monotonic() + 5
        while watcher.snapshot()[0] == version and time.monotonic() < deadline:
            time.sleep(0.02)
        version, (item,) = watcher.snapshot()
        assert item.video == mp4
        watcher.stop()  # no observer: the rescan alone must see the video go
        mp4.unlink()
        watcher.scan()
        assert watcher.snapshot()[1][0].video is None
    finally:
        watcher.stop()


def test_the_status_endpoint_lists_the_videos_beside_the_images(tmp_path: Path, ctx):
    from core.runs.status import write_status
    from ui.api import run_status

    run = tmp_path / "runs/wan"
    write_status(run, state="done", step=2, max_steps=2)
    png, mp4 = validation_round(run, 2, 0, video=True)
    (run / "validation/step_000002/.01.abc.mp4.tmp").write_bytes(b"half a video")

    status = run_status(ctx, run)

    assert status["images"] == [str(png)] and status["videos"] == [str(mp4)]


def test_the_histogram_counts_clips_by_size_and_frames(tmp_path: Path) -> None:
    """The Dataset tab's bucket chart: a video family's bars are (size, frames), so clips
    and the stills beside them are told apart."""
    from core.data.video import write_synthetic_clip
    from core.ops import check
    from ui.tab_dataset import histogram_rows

    folder = tmp_path / "clips"
    folder.mkdir()
    for name in ("a", "b"):
        write_synthetic_clip(folder / f"{name}.mp4", frames=9)
    write_shapes(folder, 1)
    cfg = video_config(str(folder), frames=5, fps=0.0)
    cfg.datasets[0].resolution = 64
    plot = histogram_rows(check(cfg, tmp_path, estimate=False)).value  # columns and rows
    bucket, images = plot["columns"].index("bucket"), plot["columns"].index("images")
    assert sorted((row[bucket], row[images]) for row in plot["data"]) == [
        ("64x64, 1 frame (1)", 1), ("64x64, 5 frames (2)", 2)]


def test_a_clip_dataset_is_counted_in_clips_not_images(tmp_path: Path, ctx,
                                                        dataset_tab) -> None:
    """Issue 54 item 4: a dataset of clips only is counted as clips, with no
    "0 image(s)": the check's summary, the preview's note, the histogram's title and the
    Cache tab's table and note."""
    import gradio as gr

    from core.data.video import write_synthetic_clip
    from core.ops import check
    from ui import tab_cache, tab_dataset
    from ui.form import Form

    folder = tmp_path / "clips"
    folder.mkdir()
    for name in ("a", "b"):
        write_synthetic_clip(folder / f"{name}.mp4", frames=9)
    cfg = video_config(str(folder), frames=5, fps=0.0)
    report = check(cfg, tmp_path, estimate=False)
    assert report.datasets[0].counted == "2 clip sample(s)"
    note = tab_dataset.preview_view(ctx, dataset_tab, cfg, 0)[dataset_tab.preview_note]
    assert "(2 clip(s); textfile)" in note and "image" not in note, note
    plot = tab_dataset.histogram_rows(report, video=True)
    assert plot.label == "Aspect buckets (samples: clips and images per bucket)"
    with gr.Blocks():
        cache_tab = tab_cache.build(Form())
    out = tab_cache.status_view(ctx, cache_tab, cfg)
    assert out[cache_tab.table].headers[1] == "samples"
    assert "count samples (clip samples and images), one latent each" in out[cache_tab.note]


def test_a_clip_preview_gif_is_written_whole_and_a_finished_one_is_kept(tmp_path: Path):
    """The preview's GIF goes through core.files (ops.write_gif): a temp of its own beside
    the target, renamed into place; another page's copy already there is kept; a failed
    write leaves nothing behind."""
    import pytest
    from PIL import Image

    from core.ops import write_gif

    frames = [Image.new("RGB", (8, 8), (i * 40, 0, 0)) for i in range(5)]
    out = write_gif(tmp_path / "clip.gif", frames, 8.0)
    with Image.open(out) as gif:
        assert gif.n_frames == 5
    first = out.read_bytes()
    write_gif(out, frames[:2], 8.0)
    assert out.read_bytes() == first
    with pytest.raises(AttributeError):
        write_gif(tmp_path / "broken.gif", [object()], 8.0)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["clip.gif"]

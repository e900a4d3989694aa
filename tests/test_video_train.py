"""Video datasets end to end on tiny Wan (issue 23): a folder of clips with sidecar
captions and an image, checked (frame buckets, a broken and a too-short clip named and
skipped), cached (clip latents keep their frames) and trained, with validation videos;
and the refusals a user can fix: frame counts the VAE cannot take, clips given to a
still-image family."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import check_in_process, small_config, train_in_process, write_shapes

from core.config import save_config


def clip_folder(folder: Path) -> Path:
    """Three 9-frame clips and one image, captioned; a broken and a 3-frame clip."""
    from core.data.video import write_synthetic_clip

    folder.mkdir(parents=True)
    for name, color, direction in (("a", "red", "right"), ("b", "blue", "left"),
                                   ("c", "green", "up")):
        made = write_synthetic_clip(folder / f"{name}.mp4", color=color, direction=direction,
                                    frames=9, fps=16)
        (folder / f"{name}.txt").write_text(f"a {made.color} {made.shape} moving {direction}")
    write_shapes(folder, 1, captions=["a still red circle"])
    (folder / "broken.mp4").write_bytes(b"this is not a video file at all" * 20)
    write_synthetic_clip(folder / "short.mp4", frames=3, fps=16)
    return folder


def wan_config(tmp_path: Path, **dataset: object):
    cfg = small_config(tmp_path, images=1, family="wan")
    ds = cfg.datasets[0]
    ds.images = str(clip_folder(tmp_path / "clips"))
    ds.frames, ds.fps = 5, 0.0
    for key, value in dataset.items():
        setattr(ds, key, value)
    cfg.validation.prompts = ["a red square moving right"]
    cfg.validation.frames = 5
    return cfg


def test_check_counts_clip_samples_and_names_the_clips_it_skips(tmp_path: Path) -> None:
    cfg = wan_config(tmp_path)
    save_config(cfg, tmp_path / "run.toml")
    done = check_in_process("--config", str(tmp_path / "run.toml"))
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    assert "dataset 'd0': 1 image(s), 3 clip sample(s)" in out
    assert "64x64, 5 frames" in out and "64x64, 1 frame " in out
    assert "broken.mp4" in out and "short.mp4: has 3 frame(s)" in out
    assert "fewer than datasets.0.frames = 5; skipped" in out


def test_uniform_takes_several_clips_from_one_video(tmp_path: Path) -> None:
    from core.cache.plan import plan_caches

    cfg = wan_config(tmp_path, clips="uniform", clip_count=2)
    plan = plan_caches(cfg, {"family": "wan", "model": "tiny"})
    jobs = [j for j in plan.vae_jobs if j.image.name == "a.mp4"]
    assert [j.frames for j in jobs] == [(0, 1, 2, 3, 4), (4, 5, 6, 7, 8)]
    assert [j.entry.name for j in jobs] == ["a.mp4.safetensors", "a.mp4.clip001.safetensors"]


@pytest.mark.parametrize(("clips", "stride", "starts"), [
    ("slide", 2, [0, 2, 4]), ("slide", 3, [0, 3]), ("chunk", 2, [0]), ("head", 2, [0])])
def test_slide_and_chunk_cut_windows_as_the_stride_says(tmp_path: Path, clips: str,
                                                         stride: int, starts: list[int]) -> None:
    """A 9-frame video, 5-frame windows: slide starts one every clip_stride frames, chunk
    takes whole windows one after another (the 4 frames left over are not a window)."""
    from core.cache.plan import plan_caches

    cfg = wan_config(tmp_path, clips=clips, clip_stride=stride)
    plan = plan_caches(cfg, {"family": "wan", "model": "tiny"})
    jobs = [j for j in plan.vae_jobs if j.image.name == "a.mp4"]
    assert [j.frames for j in jobs] == [tuple(range(s, s + 5)) for s in starts]


def test_clips_train_and_validation_writes_videos(tmp_path: Path, tiny_workspace: Path) -> None:
    from safetensors import safe_open

    from core.data.video import probe_clip

    cfg = wan_config(tmp_path)
    cfg.train.max_steps, cfg.train.eval_every, cfg.validation.every = 3, 3, 3
    save_config(cfg, tmp_path / "run.toml")
    assert train_in_process(tmp_path / "run.toml", tiny_workspace) == 0
    cache = Path(cfg.datasets[0].vae_cache)
    with safe_open(str(cache / "a.mp4.safetensors"), "pt") as fh:
        assert fh.get_slice("latents").get_shape() == [16, 2, 8, 8]  # 5 frames -> 2
    with safe_open(str(cache / "img_000.png.safetensors"), "pt") as fh:
        assert fh.get_slice("latents").get_shape() == [16, 1, 8, 8]
    assert not (cache / "broken.mp4.safetensors").exists()
    step = Path(cfg.output.dir) / "validation/step_000003"
    video = probe_clip(step / "00.mp4")
    assert (video.frames, video.width, video.height) == (5, 64, 64)
    assert (step / "00.png").is_file()


@pytest.mark.parametrize("key", ["datasets.0.frames", "validation.frames"])
def test_a_frame_count_the_vae_cannot_take_is_refused(tmp_path: Path, key: str) -> None:
    cfg = wan_config(tmp_path)
    section, *_, name = key.split(".")
    setattr(cfg.datasets[0] if section == "datasets" else cfg.validation, name, 16)
    save_config(cfg, tmp_path / "run.toml")
    done = check_in_process("--config", str(tmp_path / "run.toml"))
    assert done.returncode == 2
    assert f"error: {key}: 16 frames is not 4k + 1" in done.stdout
    assert "use 13 or 17" in done.stdout


def test_a_still_image_family_refuses_a_folder_of_clips(tmp_path: Path) -> None:
    from core.data.video import write_synthetic_clip

    cfg = small_config(tmp_path, images=1, family="sd15")
    clips = tmp_path / "only-clips"
    clips.mkdir()
    write_synthetic_clip(clips / "a.mp4", frames=5)
    cfg.datasets[0].images = str(clips)
    save_config(cfg, tmp_path / "run.toml")
    done = check_in_process("--config", str(tmp_path / "run.toml"))
    assert done.returncode == 2
    assert "error: datasets.0.images:" in done.stdout
    assert "holds 1 .mp4 video clip(s) and no images" in done.stdout
    assert "trains on images only: choose a video family" in done.stdout


@pytest.mark.slow  # the video demo preset as shipped, less its steps: half a minute
def test_the_video_demo_makes_its_clips_and_trains_to_validation_videos(tmp_path: Path) -> None:
    """`--preset demo-video` as shipped but 10 steps: its clips are generated once into
    the workspace (captioned colour, shape and direction), cached, trained (a real
    `accelerate launch`) and sampled as videos before and after."""
    from conftest import app_in_process

    from core.data.video import probe_clip

    short = ["--set", "train.max_steps=10", "--set", "validation.every=10",
             "--set", "train.eval_every=10", "--set", "train.checkpoint_every=10"]
    done = app_in_process("--no-ui", "--preset", "demo-video", "--workspace", str(tmp_path),
                          *short)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    clips = tmp_path / "demo/clips"
    assert f"demo clips: 48, with captions, in {clips}" in done.stdout
    assert len(list(clips.glob("*.mp4"))) == 48
    assert (clips / "red_square_right.txt").read_text().strip() == "a red square moving right"
    assert "dataset 'clips': 48 clip sample(s)" in done.stdout  # no "0 image(s)"
    assert "vae cache: 48 clip(s), 48 to build" in done.stdout
    run = tmp_path / "runs/demo-video"
    for step in ("step_000000", "step_000010"):
        video = probe_clip(run / "validation" / step / "00.mp4")
        assert (video.frames, video.width, video.height) == (9, 64, 64)
    assert (run / "validation/grid.png").is_file()
    assert (run / "model/model_index.json").is_file()


def test_the_grid_and_tensorboard_show_a_strip_of_each_validation_video(tmp_path: Path) -> None:
    """Where a round wrote NN.mp4, grid.png's cell is five of its frames side by side
    (first to last): the shape's motion reads left to right."""
    import numpy as np
    from PIL import Image

    from core.data.video import write_synthetic_clip
    from core.train.grid import validation_picture, write_validation_grid

    for step in ("step_000000", "step_000010"):
        folder = tmp_path / "validation" / step
        folder.mkdir(parents=True)
        write_synthetic_clip(folder / "00.mp4", color="red", direction="right", frames=9)
        Image.new("RGB", (64, 64), "white").save(folder / "00.png")
    strip = validation_picture(tmp_path / "validation/step_000010/00.png")
    assert strip.size == (5 * 64, 64)
    red = np.asarray(strip)[:, :, 0].astype(int) - np.asarray(strip)[:, :, 1]
    columns = [np.nonzero(red[:, i * 64:(i + 1) * 64].max(axis=0) > 100)[0].mean()
               for i in range(5)]
    assert columns == sorted(columns) and columns[-1] - columns[0] > 30  # moving right
    grid = Image.open(write_validation_grid(tmp_path, ["a red square moving right"]))
    assert grid.size[0] > 2 * 5 * 64  # two rounds of five-frame strips


def test_clip_caches_are_incremental_and_an_fps_change_rebuilds_only_clips(
        tmp_path: Path, tiny_workspace: Path) -> None:
    from core.cache.stage import build_caches
    from core.models.registry import get_family
    from core.models.tiny import materialize_tiny

    family = get_family("wan")
    components = family.load(str(materialize_tiny("wan", tiny_workspace)))
    cfg = wan_config(tmp_path)
    first = build_caches(cfg, family, components)
    assert first.vae.written == 4  # three clips and the image; broken and short skipped
    again = build_caches(cfg, family, components)
    assert (again.stale_vae, again.stale_text, again.vae.written) == (0, 0, 0)
    cfg.datasets[0].fps = 8.0  # 9 frames at 16 fps hold 5 at 8: other frames, same count
    changed = build_caches(cfg, family, components)
    assert (changed.stale_vae, changed.stale_text) == (3, 0)


@pytest.mark.slow
def test_two_processes_cache_each_clip_once(tmp_path: Path, tiny_workspace: Path) -> None:
    """A real two-process `accelerate launch` of the cache build over clips: each entry
    written by one process, every entry loads."""
    import os
    import subprocess

    from conftest import PYTHON, REPO, free_port

    from core.cache.store import load_entry
    from core.models.tiny import materialize_tiny

    materialize_tiny("wan", tiny_workspace)
    cfg = wan_config(tmp_path)
    save_config(cfg, tmp_path / "run.toml")
    command = [PYTHON, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes",
               "2", "--num_machines", "1", "--main_process_port", str(free_port()),
               "--mixed_precision", "no", "--dynamo_backend", "no", "-m", "core.cache.main",
               "--config", str(tmp_path / "run.toml"), "--workspace", str(tiny_workspace)]
    done = subprocess.run(command, cwd=REPO, env={**os.environ, "ACCELERATE_USE_CPU": "1"},
                          capture_output=True, text=True, timeout=400)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    writes = [line for line in done.stdout.splitlines() if line.startswith("process ")]
    assert sum(int(line.split("wrote ")[1].split(" vae")[0]) for line in writes) == 4
    found = list(Path(cfg.datasets[0].vae_cache).rglob("*.safetensors"))
    assert len(found) == 4
    for path in found:
        load_entry(path)

"""Every file a config names is read at `--stage check`, with the key named, before
anything is loaded (issue 40 item 1): a run must not stop at its first validation on a
control image the preset left in, and a damaged mask or control image is said at check,
not in the cache build's log. (model.config: tests/test_single_file.py.)"""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import check_in_process, small_config, write_controls, write_shapes

from core.config import save_config

KONTEXT = ("--preset", "flux-kontext-lora", "--set", "model.path=tiny:flux_kontext",
           "--set", "model.quantize=none")


def _user_pairs(workspace: Path) -> None:
    """A user's pairs where the preset looks for them, without the preset's example.png."""
    write_shapes(workspace / "data/pairs/edited", 3)
    write_controls(workspace / "data/pairs/source", workspace / "data/pairs/edited")


def test_the_kontext_preset_with_its_example_control_image_missing_is_refused_at_check(
        tmp_path: Path) -> None:
    _user_pairs(tmp_path)
    done = check_in_process(*KONTEXT, "--workspace", str(tmp_path))
    assert done.returncode == 2, done.stdout + done.stderr
    missing = tmp_path / "data/pairs/source/example.png"
    assert (f"error: validation.control_images: entry 1 (prompt 1: 'make the jacket red'): "
            f"{missing} does not exist") in done.stdout
    fixed = check_in_process(*KONTEXT, "--workspace", str(tmp_path), "--set",
                             "validation.control_images=[\"data/pairs/source/img_000.png\"]")
    assert "validation.control_images" not in fixed.stdout, fixed.stdout


def test_launch_in_the_ui_refuses_it_and_starts_nothing(tmp_path: Path, ctx) -> None:
    from core.ops import load_run_config
    from ui.actions import ActionError, launch, stop

    _user_pairs(tmp_path)
    cfg = load_run_config(None, "flux-kontext-lora", list(KONTEXT[3::2]))
    try:
        launched = launch(ctx, cfg)
    except ActionError as refused:
        assert [p.where for p in refused.problems] == ["validation.control_images"]
    else:  # the bug: it started; end it before failing, so no trainer outlives the test
        stop(ctx, launched.run_dir, grace_s=0.1)
        pytest.fail("Launch started a run whose validation control image is missing")
    assert not (tmp_path / "runs/flux-kontext-lora").exists(), "no run folder, no process"


def test_a_damaged_validation_control_image_is_an_error_naming_the_entry(
        tmp_path: Path) -> None:
    cfg = small_config(tmp_path, family="flux_kontext")
    cfg.validation.prompts = ["make it red", "make it blue"]
    damaged = tmp_path / "half.png"
    damaged.write_bytes(Path(cfg.validation.control_images[0]).read_bytes()[:80])
    cfg.validation.control_images = [cfg.validation.control_images[0], str(damaged)]
    save_config(cfg, tmp_path / "run.toml")
    done = check_in_process("--config", str(tmp_path / "run.toml"))
    assert done.returncode == 2
    assert (f"error: validation.control_images: entry 2 (prompt 2: 'make it blue'): "
            f"{damaged}: ") in done.stdout
    assert "entry 1" not in done.stdout


def test_an_unreadable_control_image_is_named_at_check_and_its_target_left_out(
        tmp_path: Path) -> None:
    cfg = small_config(tmp_path, family="flux_kontext")
    control = Path(cfg.datasets[0].control) / "img_002.png"
    control.write_bytes(b"not a png")
    save_config(cfg, tmp_path / "run.toml")
    done = check_in_process("--config", str(tmp_path / "run.toml"))
    assert done.returncode == 0, done.stdout
    assert (f"warning: datasets.0.control: {control}: not an image file") in done.stdout
    assert "img_002.png, its target, is left out of training" in done.stdout
    assert "dataset 'd0': 5 image(s), each paired with 1 control image" in done.stdout


def test_an_unreadable_mask_is_named_at_check_and_its_image_trains_unmasked(
        tmp_path: Path) -> None:
    from PIL import Image

    from core.data.index import index_dataset

    cfg = small_config(tmp_path, images=2)
    masks = tmp_path / "masks"
    masks.mkdir()
    Image.new("L", (64, 64), 255).save(masks / "img_000.png")
    (masks / "img_001.png").write_bytes(b"")
    cfg.datasets[0].masks = str(masks)
    save_config(cfg, tmp_path / "run.toml")
    done = check_in_process("--config", str(tmp_path / "run.toml"))
    assert done.returncode == 0, done.stdout
    assert (f"warning: datasets.0.masks: {masks / 'img_001.png'}: empty file") in done.stdout
    assert "img_001.png trains unmasked" in done.stdout
    items = index_dataset(cfg.datasets[0], "datasets.0").items
    assert [i.mask for i in items] == [masks / "img_000.png", None], "as the check said"


def test_a_missing_init_lora_is_an_error_at_check(tmp_path: Path) -> None:
    cfg = small_config(tmp_path)
    cfg.train.init_lora = str(tmp_path / "gone.safetensors")
    save_config(cfg, tmp_path / "run.toml")
    done = check_in_process("--config", str(tmp_path / "run.toml"))
    assert done.returncode == 2
    assert f"error: train.init_lora: {tmp_path / 'gone.safetensors'} is not a file" \
        in done.stdout

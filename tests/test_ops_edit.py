"""core.ops for edit families (issue 24) as the UI uses them, without gradio: which
families are edit families, the preview's pair thumbnail (control | target) and a run's
validation control images."""

from __future__ import annotations

from pathlib import Path

import pytest


def solid(path: Path, size: tuple[int, int], colour: tuple[int, int, int]) -> Path:
    from PIL import Image

    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", size, colour).save(path)
    return path


def near(colour: tuple[int, int, int], wanted: tuple[int, int, int], tol: int = 12) -> bool:
    return all(abs(a - b) <= tol for a, b in zip(colour, wanted, strict=True))


@pytest.mark.parametrize(("family", "edit"), [
    ("flux_kontext", True), ("sd15", False), ("wan", False), ("no-such-family", False)])
def test_the_edit_tag_holds_for_edit_families_only(family: str, edit: bool) -> None:
    from core.ops import family_has

    assert family_has("edit", family) is edit
    if edit:
        assert not family_has("video", family)


def test_a_pair_thumbnail_shows_the_control_then_the_target(tmp_path: Path) -> None:
    from core.ops import edit_pair_thumbnail
    from core.ops.edits import GAP

    target = solid(tmp_path / "edited/a.png", (64, 64), (220, 30, 30))
    control = solid(tmp_path / "source/a.jpg", (64, 64), (30, 30, 220))

    thumb = edit_pair_thumbnail(target, [control], height=96)

    assert thumb.size == (96 * 2 + GAP, 96)  # square images: about twice as wide as high
    assert near(thumb.getpixel((20, 48)), (30, 30, 220), tol=20)  # JPEG: near, not equal
    assert near(thumb.getpixel((96 + GAP + 20, 48)), (220, 30, 30))


def test_controls_of_other_shapes_keep_their_aspect_in_reference_order(tmp_path: Path) -> None:
    from core.ops import edit_pair_thumbnail
    from core.ops.edits import GAP

    target = solid(tmp_path / "t.png", (32, 32), (220, 30, 30))
    wide = solid(tmp_path / "c1.png", (64, 32), (30, 200, 30))
    tall = solid(tmp_path / "c2.png", (32, 64), (30, 30, 220))

    thumb = edit_pair_thumbnail(target, [wide, tall], height=64)

    assert thumb.size == (128 + 32 + 64 + 2 * GAP, 64)
    assert near(thumb.getpixel((60, 32)), (30, 200, 30))
    assert near(thumb.getpixel((128 + GAP + 16, 32)), (30, 30, 220))
    assert near(thumb.getpixel((thumb.width - 10, 32)), (220, 30, 30))


def test_a_pair_with_an_unreadable_file_has_no_thumbnail(tmp_path: Path) -> None:
    from core.ops import edit_pair_thumbnail

    target = solid(tmp_path / "t.png", (32, 32), (220, 30, 30))
    (tmp_path / "bad.png").write_text("not an image", encoding="utf-8")

    assert edit_pair_thumbnail(target, [tmp_path / "bad.png"]) is None
    assert edit_pair_thumbnail(target, [tmp_path / "missing.png"]) is None


def test_validation_controls_resolve_against_the_workspace_and_split_entries(
        tmp_path: Path) -> None:
    from core.config import Config, ModelConfig, ValidationConfig
    from core.ops import validation_controls

    cfg = Config(model=ModelConfig(family="flux_kontext", path="tiny:flux_kontext"),
                 validation=ValidationConfig(prompts=["red", "blue"], control_images=[
                     "data/a.png", f"{tmp_path}/b.png | data/c.png"]))

    assert validation_controls(cfg, tmp_path / "ws") == [
        [tmp_path / "ws/data/a.png"], [tmp_path / "b.png", tmp_path / "ws/data/c.png"]]
    cfg.model.family = "sd15"  # its trainer ignores them, so the UI shows none
    assert validation_controls(cfg, tmp_path / "ws") == []

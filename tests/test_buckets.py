"""Aspect buckets: the sizes a user's photos train at, and the histogram the check prints."""

from __future__ import annotations

import random

import pytest

from core.data.buckets import (
    BUCKET_MULTIPLE,
    Bucket,
    bucket_for,
    bucket_histogram,
    bucket_list,
    check_resolution,
    check_settings,
    crop_box,
    effective_resolution,
    format_histogram,
    is_upscaled,
    upscale_factor,
)


def test_full_hd_photo_at_1024_gets_the_sdxl_landscape_bucket() -> None:
    b = bucket_for(1920, 1080, 1024, bucketing=True, crop="center")
    assert b.width > b.height
    assert b.width % BUCKET_MULTIPLE == 0 and b.height % BUCKET_MULTIPLE == 0
    assert b.area <= 1024 * 1024
    assert b == (1344, 768)  # the standard SDXL 16:9-ish bucket, 98% of the pixel budget


@pytest.mark.parametrize("resolution", [256, 512, 768, 1000, 1024, 2048])
def test_bucket_list_sides_area_aspect_and_symmetry(resolution: int) -> None:
    buckets = bucket_list(resolution)
    side = effective_resolution(resolution)
    assert Bucket(side, side) in buckets  # square images keep the full resolution
    for b in buckets:
        assert b.width % 64 == 0 and b.height % 64 == 0
        assert b.area <= side * side
        assert 1 / 4 <= b.aspect <= 4
        assert Bucket(b.height, b.width) in buckets
        # maximal: every bucket uses most of the budget (no needlessly small sizes)
        assert b.area > 0.75 * side * side
    assert buckets == bucket_list(resolution)  # deterministic


@pytest.mark.parametrize("size", [(1920, 1080), (3000, 2000), (800, 1200), (5000, 700),
                                  (333, 1000), (1023, 1024)])
def test_portrait_and_landscape_are_mirror_images(size: tuple[int, int]) -> None:
    w, h = size
    a = bucket_for(w, h, 1024)
    b = bucket_for(h, w, 1024)
    assert (a.width, a.height) == (b.height, b.width)


def test_chosen_bucket_is_the_closest_aspect() -> None:
    import math

    for w, h in [(1920, 1080), (1000, 1500), (640, 480), (4000, 1000)]:
        chosen = bucket_for(w, h, 768)
        dist = [abs(math.log(b.aspect / (w / h))) for b in bucket_list(768)]
        assert abs(math.log(chosen.aspect / (w / h))) == pytest.approx(min(dist))


def test_extreme_aspect_clamps_to_four_to_one() -> None:
    assert bucket_for(10000, 100, 512) == (1024, 256)
    assert bucket_for(100, 10000, 512) == (256, 1024)


def test_without_bucketing_every_image_is_square_and_resolution_rounds_down() -> None:
    assert bucket_for(1920, 1080, 512, bucketing=False) == (512, 512)
    assert bucket_for(1920, 1080, 1000, bucketing=False) == (960, 960)
    [problem] = check_resolution(1000, "datasets.0.resolution")
    assert problem.level == "warning" and "960" in problem.message
    assert problem.where == "datasets.0.resolution"
    assert check_resolution(512, "datasets.0.resolution") == []


def test_bad_inputs_raise_clear_errors() -> None:
    with pytest.raises(ValueError, match="at least 64"):
        bucket_for(100, 100, 32)
    with pytest.raises(ValueError, match="at least 64"):
        bucket_list(63)
    with pytest.raises(ValueError, match="width must be a positive integer"):
        bucket_for(0, 100, 512)
    with pytest.raises(ValueError, match="unknown crop 'middle'"):
        bucket_for(100, 100, 512, crop="middle")
    [problem] = check_resolution(32, "datasets.1.resolution")
    assert problem.level == "error" and "at least 64" in problem.message


def test_crop_none_without_bucketing_is_flagged() -> None:
    [p] = check_settings(False, "none", "datasets.0")
    assert p.level == "warning" and p.where == "datasets.0.crop"
    assert check_settings(True, "none", "datasets.0") == []
    assert check_settings(True, "middle", "datasets.0")[0].level == "error"


def test_center_crop_covers_the_bucket_and_centers() -> None:
    bucket = bucket_for(1920, 1080, 1024)
    box = crop_box(1920, 1080, bucket, "center")
    assert box.scaled_height == bucket.height  # height is the binding side
    assert box.scaled_width >= bucket.width
    assert box.left == (box.scaled_width - bucket.width) // 2 and box.top == 0
    assert not is_upscaled(1920, 1080, bucket)


def test_random_crop_needs_an_rng_and_stays_inside() -> None:
    bucket = Bucket(512, 512)
    with pytest.raises(ValueError, match="rng"):
        crop_box(1000, 600, bucket, "random")
    offsets = {crop_box(1000, 600, bucket, "random", random.Random(s)).left for s in range(20)}
    box = crop_box(1000, 600, bucket, "random", random.Random(0))
    assert len(offsets) > 1  # actually random
    assert all(0 <= x <= box.scaled_width - 512 for x in offsets)
    assert box == crop_box(1000, 600, bucket, "random", random.Random(0))  # seeded


def test_crop_none_resizes_to_the_bucket_exactly() -> None:
    assert crop_box(1000, 600, Bucket(640, 384), "none") == (640, 384, 0, 0)


def test_small_images_are_reported_as_upscaled() -> None:
    bucket = bucket_for(300, 200, 512)
    assert is_upscaled(300, 200, bucket)
    assert upscale_factor(300, 200, bucket) > 1.5
    box = crop_box(300, 200, bucket, "center")
    assert box.scaled_width >= bucket.width and box.scaled_height >= bucket.height


def test_histogram_sorted_and_formatted() -> None:
    items = [bucket_for(1920, 1080, 512)] * 3 + [bucket_for(800, 800, 512)] * 120
    items += [bucket_for(600, 900, 512)] * 7
    hist = bucket_histogram(items)
    assert [(b.label, n) for b, n in hist] == [("384x640", 7), ("512x512", 120), ("640x384", 3)]
    lines = format_histogram(hist)
    assert lines[1].startswith("  512x512   : 120 ███")
    assert lines[0].startswith("  384x640   :   7 █")
    bars = [line.count("█") for line in lines]
    assert bars[1] == max(bars) and min(bars) >= 1
    assert format_histogram([]) == []


def test_bucket_side_limits_leave_out_the_thin_buckets_and_say_when_none_is_left() -> None:
    from core.data.buckets import check_sides

    whole = bucket_list(512)
    kept = bucket_list(512, min_side=384, max_side=704)
    assert kept and set(kept) < set(whole)
    assert all(384 <= min(b) and max(b) <= 704 for b in kept)
    # A 4:1 panorama goes to the widest bucket left instead of 1024x256.
    assert bucket_for(2000, 500, 512) == (1024, 256)
    assert bucket_for(2000, 500, 512, min_side=384, max_side=704) == max(kept, key=lambda b:
                                                                         b.aspect)
    assert check_sides(512, 384, 704, True, "datasets.0") == []
    [none] = check_sides(512, 0, 128, True, "datasets.0")
    assert none.where == "datasets.0.bucket_max_side" and "leaves no bucket" in none.message
    [order] = check_sides(512, 600, 500, True, "datasets.0")
    assert order.where == "datasets.0.bucket_min_side" and order.level == "error"
    [off] = check_sides(512, 256, 0, False, "datasets.0")
    assert off.level == "warning" and "bucketing is off" in off.message


def test_captions_that_name_a_side_are_counted_for_flip() -> None:
    from core.data.tags import mirrored_captions

    assert mirrored_captions(["a cat on the Left", "rightmost", "a dog", "right hand"]) == 2


def test_the_check_warns_of_sided_captions_under_flip_and_refuses_flip_on_pairs(
        tmp_path) -> None:
    from conftest import small_config

    from core.check import run_check

    cfg = small_config(tmp_path, images=3)
    (tmp_path / "data0/img_001.txt").write_text("a circle on the left", encoding="utf-8")
    cfg.datasets[0].flip = True

    def said() -> dict[str, str]:
        return {p.where: str(p) for p in run_check(cfg, tmp_path, estimate=False).problems}

    assert "1 caption(s) say left or right" in said()["datasets.0.flip"]
    cfg.datasets[0].bucket_max_side = 32
    assert "leaves no bucket" in said()["datasets.0.bucket_max_side"]
    edit = small_config(tmp_path / "edit", images=1, family="flux_kontext")
    edit.datasets[0].flip = True
    assert any(p.where == "datasets.0.flip" and p.level == "error"
               for p in run_check(edit, tmp_path, estimate=False).problems)

"""Directory conflicts: every rule, reported with the dataset id, both keys and both paths."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from core.config import Config, DatasetConfig, OutputConfig, TextCacheConfig, resolved
from core.data.conflicts import check_directory_conflicts, relation


def make(tmp: Path, datasets: list[dict], text: str = "cache/text",
         output: str = "runs/r") -> Config:
    (tmp / "data/a").mkdir(parents=True, exist_ok=True)
    (tmp / "data/b").mkdir(parents=True, exist_ok=True)
    cfg = Config(datasets=[DatasetConfig(**d) for d in datasets],
                 text_cache=TextCacheConfig(dir=text), output=OutputConfig(dir=output))
    return resolved(cfg, tmp)


def one(tmp: Path, **overrides) -> Config:
    ds = {"id": "cats", "images": "data/a", "vae_cache": "cache/cats"} | overrides
    return make(tmp, [ds])


def lines(cfg: Config) -> list[str]:
    return [str(p) for p in check_directory_conflicts(cfg)]


def test_clean_layout_has_no_problems(tmp_path: Path):
    cfg = make(tmp_path, [{"id": "a", "images": "data/a", "vae_cache": "cache/a"},
                          {"id": "b", "images": "data/b", "vae_cache": "cache/b"}])
    assert check_directory_conflicts(cfg) == []


@pytest.mark.parametrize("cache", ["data/a", "data/a/", "data/a/cache", "./data/../data/a",
                                   "data/a/sub/../.latents"])
def test_vae_cache_in_or_equal_to_images_is_an_error(tmp_path: Path, cache: str):
    found = lines(one(tmp_path, vae_cache=cache))
    assert len(found) == 1, found
    message = found[0]
    assert message.startswith("error: datasets.0.vae_cache:")
    assert "dataset 'cats'" in message and "datasets.0.images" in message
    assert str(tmp_path / "data/a") in message


def test_images_inside_the_cache_is_an_error_too(tmp_path: Path):
    found = lines(one(tmp_path, images="data/a", vae_cache="data"))
    assert any("datasets.0.vae_cache" in m and "contains" in m for m in found)


def test_symlink_cannot_hide_a_conflict(tmp_path: Path):
    (tmp_path / "data/a").mkdir(parents=True)
    os.symlink(tmp_path / "data/a", tmp_path / "alias")
    found = lines(one(tmp_path, vae_cache="alias/latents"))
    assert len(found) == 1 and "is inside" in found[0] and "datasets.0.images" in found[0]


def test_two_datasets_sharing_a_vae_cache(tmp_path: Path):
    cfg = make(tmp_path, [{"id": "a", "images": "data/a", "vae_cache": "cache/shared"},
                          {"id": "b", "images": "data/b", "vae_cache": "cache/shared/"}])
    found = lines(cfg)
    assert len(found) == 1
    assert found[0].startswith("error: datasets.1.vae_cache:")
    assert "dataset 'b'" in found[0] and "dataset 'a'" in found[0]
    assert "datasets.0.vae_cache" in found[0] and "overwrite each other" in found[0]


@pytest.mark.parametrize("cache", ["data/a/latents_b", "data"])
def test_another_datasets_cache_in_or_around_images_is_an_error(tmp_path: Path, cache: str):
    """B's vae_cache inside (or around) A's images: A's scan would read B's cache files,
    and clearing B's cache refuses; the check must show the same conflict."""
    from core.cache.clear import ClearRefused, find_cache_files

    cfg = make(tmp_path, [{"id": "a", "images": "data/a", "vae_cache": "cache/a"},
                          {"id": "b", "images": "data/b", "vae_cache": cache}])
    found = [m for m in lines(cfg) if "datasets.0.images" in m]
    assert len(found) == 1, lines(cfg)
    assert found[0].startswith("error: datasets.1.vae_cache: dataset 'b' vae_cache")
    assert "dataset 'a' images" in found[0] and str(tmp_path / "data/a") in found[0]
    with pytest.raises(ClearRefused, match="the check shows the conflict"):
        find_cache_files(cfg.datasets[1], cfg)


def test_text_cache_sharing_a_vae_cache(tmp_path: Path):
    for text in ("cache/cats", "cache/cats/text", "cache"):
        found = lines(make(tmp_path, [{"id": "cats", "images": "data/a",
                                       "vae_cache": "cache/cats"}], text=text))
        assert any(m.startswith("error: text_cache.dir:") and "datasets.0.vae_cache" in m
                   for m in found), (text, found)


def test_text_cache_inside_images(tmp_path: Path):
    found = lines(make(tmp_path, [{"id": "cats", "images": "data/a",
                                   "vae_cache": "cache/cats"}], text="data/a/.text"))
    assert any(m.startswith("error: text_cache.dir:") and "datasets.0.images" in m
               for m in found)


@pytest.mark.parametrize("output, against", [
    ("data/a", "datasets.0.images"), ("data/a/runs", "datasets.0.images"),
    ("data", "datasets.0.images"), ("cache/cats", "datasets.0.vae_cache"),
    ("cache/cats/run", "datasets.0.vae_cache"), ("cache/text/run", "text_cache.dir"),
])
def test_output_inside_images_or_caches(tmp_path: Path, output: str, against: str):
    found = lines(make(tmp_path, [{"id": "cats", "images": "data/a",
                                   "vae_cache": "cache/cats"}], output=output))
    assert any(m.startswith("error: output.dir:") and against in m for m in found), found


def test_caches_inside_the_output_folder_are_allowed(tmp_path: Path):
    cfg = make(tmp_path, [{"id": "cats", "images": "data/a", "vae_cache": "runs/r/cache/vae"}],
               text="runs/r/cache/text", output="runs/r")
    assert check_directory_conflicts(cfg) == []


def test_two_datasets_reading_the_same_images_is_a_warning(tmp_path: Path):
    cfg = make(tmp_path, [{"id": "a", "images": "data/a", "vae_cache": "cache/a"},
                          {"id": "b", "images": "data/a/", "vae_cache": "cache/b"}])
    problems = check_directory_conflicts(cfg)
    assert [p.level for p in problems] == ["warning"]
    assert "datasets.1.images" in str(problems[0]) and "datasets.0.images" in str(problems[0])


def test_missing_images_folder_is_an_error(tmp_path: Path):
    found = lines(one(tmp_path, images="data/nope"))
    assert found == [f"error: datasets.0.images: dataset 'cats' images folder "
                     f"{tmp_path / 'data/nope'} does not exist; create it or fix the path"]


def test_relation_is_symmetric_and_exact(tmp_path: Path):
    assert relation(tmp_path / "a", tmp_path / "a/") == "same"
    assert relation(tmp_path / "a/b", tmp_path / "a") == "inside"
    assert relation(tmp_path / "a", tmp_path / "a/b") == "contains"
    assert relation(tmp_path / "ab", tmp_path / "a") is None, "a prefix is not a parent"


@pytest.mark.parametrize("masks,against", [("data/a", "datasets.0.images"),
                                           ("data/a/masks", "datasets.0.images"),
                                           ("cache/cats", "datasets.0.vae_cache"),
                                           ("cache/cats/m", "datasets.0.vae_cache"),
                                           ("cache/text/m", "text_cache.dir")])
def test_masks_in_or_equal_to_images_or_a_cache_is_an_error(tmp_path: Path, masks: str,
                                                             against: str):
    (tmp_path / masks).mkdir(parents=True, exist_ok=True)
    found = lines(one(tmp_path, masks=masks))
    assert len(found) == 1, found
    assert found[0].startswith("error: datasets.0.masks:")
    assert against in found[0] and str(tmp_path / masks) in found[0]


def test_masks_beside_the_images_are_fine_and_a_missing_masks_folder_is_named(
        tmp_path: Path):
    (tmp_path / "masks").mkdir()
    assert lines(one(tmp_path, masks="masks")) == []
    found = lines(one(tmp_path, masks="nowhere"))
    assert len(found) == 1 and found[0].startswith("error: datasets.0.masks:")
    assert "does not exist" in found[0]

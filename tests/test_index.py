"""Dataset index: problems named by key and file, bad files skipped, nothing written."""

from __future__ import annotations

import io
import os
from pathlib import Path

from PIL import Image

from core.config import DatasetConfig
from core.data.index import MAX_LISTED_NO_CAPTION, index_dataset


def _ds(root: Path, **kwargs) -> DatasetConfig:
    kwargs.setdefault("vae_cache", str(root.parent / "cache" / "vae"))
    return DatasetConfig(id="shapes", images=str(root), **kwargs)


def _png(path: Path, size: tuple[int, int] = (32, 24), caption: str | None = None) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", size, (200, 30, 30)).save(path)
    if caption is not None:
        path.with_suffix(".txt").write_text(caption, encoding="utf-8")
    return path


def _messages(index) -> list[str]:
    return [str(p) for p in index.problems]


def _tree(root: Path) -> list[tuple[str, int]]:
    return sorted((str(p), p.stat().st_mtime_ns) for p in root.rglob("*"))


def test_missing_folder_is_an_error_naming_key_and_path(tmp_path: Path):
    index = index_dataset(_ds(tmp_path / "nope"), "datasets.1")
    assert not index.ok and index.items == []
    assert _messages(index) == [f"error: datasets.1.images: folder not found: {tmp_path / 'nope'}"
                                "; check the path (relative paths are resolved against the "
                                "workspace)"]


def test_file_instead_of_folder_and_empty_setting(tmp_path: Path):
    (tmp_path / "a.png").write_bytes(b"x")
    index = index_dataset(_ds(tmp_path / "a.png"), "datasets.0")
    assert "is a file, not a folder" in _messages(index)[0]
    index = index_dataset(DatasetConfig(images=""), "datasets.0")
    assert _messages(index) == ["error: datasets.0.images: is empty; set the folder of images"]


def test_empty_folder_says_which_formats_and_what_was_ignored(tmp_path: Path):
    root = tmp_path / "photos"
    root.mkdir()
    (root / "IMG_1.heic").write_bytes(b"x")
    (root / "readme.txt").write_text("hi")
    index = index_dataset(_ds(root), "datasets.0")
    assert not index.ok
    assert _messages(index) == [
        f"warning: datasets.0.images: ignored 1 .heic file(s) in {root}: not a supported "
        "format (png, jpg, jpeg, webp, bmp); convert them to use them",
        f"error: datasets.0.images: no images found in {root} (png, jpg, jpeg, webp, bmp)",
    ]


def test_bad_images_are_skipped_with_a_warning_naming_the_file(tmp_path: Path):
    root = tmp_path / "photos"
    good = _png(root / "good.png", (40, 30), caption="a red square")
    (root / "empty.jpg").write_bytes(b"")
    (root / "notes.jpg").write_text("not an image")
    other = _png(root / "sub" / "other.png", (20, 20), caption="another")
    index = index_dataset(_ds(root), "datasets.0")
    assert index.ok  # warnings only
    assert [i.path for i in index.items] == [good, other]
    assert index.items[0].caption == "a red square"
    assert (index.items[0].width, index.items[0].height) == (40, 30)
    msgs = _messages(index)
    assert f"warning: {root / 'empty.jpg'}: empty file (0 bytes); re-export it or remove it; " \
           "skipped" in msgs
    assert any(m.startswith(f"warning: {root / 'notes.jpg'}: not an image file") for m in msgs)


def test_truncated_image_is_caught_only_with_verify(tmp_path: Path):
    root = tmp_path / "photos"
    _png(root / "ok.png", caption="fine")
    data = io.BytesIO()
    Image.effect_noise((64, 64), 50).convert("RGB").save(data, "JPEG")
    (root / "cut.jpg").write_bytes(data.getvalue()[: len(data.getvalue()) // 2])
    (root / "cut.txt").write_text("cut")
    fast = index_dataset(_ds(root), "datasets.0")
    assert len(fast.items) == 2 and fast.problems == []
    slow = index_dataset(_ds(root), "datasets.0", verify=True)
    assert [i.path.name for i in slow.items] == ["ok.png"]
    assert _messages(slow) == [f"warning: {root / 'cut.jpg'}: truncated image file (re-export "
                               "it or remove it); skipped"]


def test_all_images_bad_is_an_error(tmp_path: Path):
    root = tmp_path / "photos"
    root.mkdir()
    (root / "a.png").write_bytes(b"")
    (root / "b.png").write_text("nope")
    index = index_dataset(_ds(root), "datasets.2")
    assert not index.ok and index.items == []
    assert _messages(index)[-1] == (f"error: datasets.2.images: no usable images in {root}: "
                                    "all 2 were skipped (see the warnings)")


def test_missing_captions_warn_and_keep_the_image(tmp_path: Path):
    root = tmp_path / "photos"
    _png(root / "a.png", caption="apple")
    _png(root / "b.png")
    index = index_dataset(_ds(root), "datasets.0")
    assert index.ok and [i.caption for i in index.items] == ["apple", ""]
    assert _messages(index) == [f"warning: {root / 'b.png'}: no caption: b.txt not found next "
                                "to it"]


def test_many_missing_captions_are_summed_up(tmp_path: Path):
    root = tmp_path / "photos"
    src = _png(root / "000.png")
    for i in range(1, 15):
        (root / f"{i:03d}.png").write_bytes(src.read_bytes())
    index = index_dataset(_ds(root), "datasets.0")
    assert len(index.items) == 15
    assert len(index.problems) == MAX_LISTED_NO_CAPTION + 1
    assert str(index.problems[-1]) == (
        f"warning: datasets.0.images: 15 of 15 images have no caption (the first "
        f"{MAX_LISTED_NO_CAPTION} are listed above); they train with an empty caption")


def test_vae_cache_inside_images_is_not_scanned(tmp_path: Path):
    root = tmp_path / "photos"
    _png(root / "a.png", caption="a")
    cache = root / "latents"
    _png(cache / "looks_like_an_image.png", caption="x")
    index = index_dataset(_ds(root, vae_cache=str(cache)), "datasets.0")
    assert [i.path.name for i in index.items] == ["a.png"]


def test_jsonl_strategy_and_exif_sizes(tmp_path: Path):
    root = tmp_path / "photos"
    exif = Image.Exif()
    exif[0x0112] = 6
    (root / "sub").mkdir(parents=True)
    Image.new("RGB", (60, 20)).save(root / "sub" / "phone.jpg", exif=exif)
    (root / "metadata.jsonl").write_text('{"file_name": "sub/phone.jpg", "text": "upright"}\n'
                                         "oops\n")
    index = index_dataset(_ds(root, caption="jsonl"), "datasets.0")
    (item,) = index.items
    assert (item.width, item.height, item.caption) == (20, 60, "upright")
    assert _messages(index) == [f"warning: {root / 'metadata.jsonl'}:2: not valid JSON "
                                "(Expecting value); line ignored"]


def test_check_creates_nothing_and_reports_progress(tmp_path: Path):
    root = tmp_path / "photos"
    for i in range(70):
        _png(root / f"{i:02d}.png", caption=f"image {i}")
    before = _tree(tmp_path)
    calls: list[tuple[int, int]] = []
    ds = _ds(root, vae_cache=str(tmp_path / "cache" / "vae"), caption="textfile")
    index = index_dataset(ds, "datasets.0", progress=lambda d, t: calls.append((d, t)))
    assert len(index.items) == 70 and index.ok
    assert calls == [(64, 70), (70, 70)]
    assert _tree(tmp_path) == before
    assert not (tmp_path / "cache").exists()
    assert not any(name.startswith("__") for name in os.listdir(root))

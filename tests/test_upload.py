"""Uploaded images land in a new dataset folder of the workspace, captions matched by stem,
nothing overwritten, non-images skipped and named."""

from __future__ import annotations

from pathlib import Path

from conftest import write_shapes

from core.ops import dataset_name, upload_images, uploaded_dataset


def _uploads(tmp_path: Path) -> list[Path]:
    src = tmp_path / "upload"
    images = write_shapes(src, 3)
    (src / "img_001.txt").unlink()  # one image without its caption
    (src / "notes.pdf").write_bytes(b"%PDF")
    (src / "orphan.txt").write_text("no image")
    return [*images, src / "img_000.txt", src / "img_002.txt", src / "notes.pdf",
            src / "orphan.txt"]


def test_upload_copies_images_and_matching_captions_and_names_what_it_skipped(tmp_path):
    ws = tmp_path / "ws"
    result = upload_images(_uploads(tmp_path), ws, "my cats!")
    folder = ws / "datasets/my-cats"
    assert result.folder == folder
    assert sorted(p.name for p in folder.iterdir()) == [
        "img_000.png", "img_000.txt", "img_001.png", "img_002.png", "img_002.txt"]
    assert (folder / "img_002.txt").read_text() == "image number 2"
    assert [s.split(" ")[0] for s in result.skipped] == ["notes.pdf", "orphan.txt"]
    text = "; ".join(result.notes())
    assert "copied 3 image(s) and 2 caption(s)" in text and "notes.pdf (not an image" in text


def test_upload_never_overwrites_an_existing_file(tmp_path):
    ws = tmp_path / "ws"
    folder = ws / "datasets/cats"
    folder.mkdir(parents=True)
    (folder / "img_000.png").write_bytes(b"mine")
    (folder / "img_002.txt").write_text("my caption")
    result = upload_images(_uploads(tmp_path), ws, "cats")
    assert (folder / "img_000.png").read_bytes() == b"mine"
    assert (folder / "img_002.txt").read_text() == "my caption"
    assert ("img_000.png", "img_000-2.png") in result.renamed
    assert ("img_002.png", "img_002-2.png") in result.renamed  # its .txt name was taken
    assert (folder / "img_002-2.txt").read_text() == "image number 2"
    assert "kept existing files" in "; ".join(result.notes())


def test_the_uploaded_dataset_caches_outside_its_images():
    ds = uploaded_dataset(dataset_name(" holiday 2024 "))
    assert (ds.id, ds.images, ds.vae_cache) == (
        "holiday-2024", "datasets/holiday-2024", "cache/holiday-2024/vae")
    assert dataset_name("../..") == "uploaded"

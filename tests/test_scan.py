"""Folder scanning: which files count as images, in what order, and what is skipped."""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path

import pytest

from core.data.scan import scan_images


def _touch(root: Path, *names: str) -> None:
    for name in names:
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"x")


def _rel(paths: list[Path], root: Path) -> list[str]:
    return [p.relative_to(root).as_posix() for p in paths]


def test_recursive_sorted_case_insensitive(tmp_path: Path):
    _touch(tmp_path, "b.png", "a.JPG", "sub/c.Jpeg", "sub/deeper/d.webp", "e.BMP",
           "a.txt", "metadata.jsonl", "notes.md", "f.gif")
    found = scan_images(tmp_path)
    assert _rel(found, tmp_path) == ["a.JPG", "b.png", "e.BMP", "sub/c.Jpeg",
                                     "sub/deeper/d.webp"]
    assert all(p.is_absolute() for p in found)
    assert scan_images(tmp_path) == found  # same order every time


def test_hidden_files_and_folders_are_skipped(tmp_path: Path):
    _touch(tmp_path, "keep.png", ".hidden.png", "._keep.png", ".cache/x.png",
           "sub/.thumbs/y.jpg", "sub/z.jpg")
    assert _rel(scan_images(tmp_path), tmp_path) == ["keep.png", "sub/z.jpg"]


def test_excluded_folder_is_skipped(tmp_path: Path):
    _touch(tmp_path, "a.png", "cache/vae/latent.png", "cache_not/b.png")
    found = scan_images(tmp_path, exclude=[tmp_path / "cache" / "vae", ""])
    assert _rel(found, tmp_path) == ["a.png", "cache_not/b.png"]


def test_other_image_formats_are_counted(tmp_path: Path):
    _touch(tmp_path, "a.png", "IMG_1.HEIC", "IMG_2.heic", "anim.gif", "readme.txt")
    others: Counter[str] = Counter()
    assert len(scan_images(tmp_path, others=others)) == 1
    assert others == Counter({".heic": 2, ".gif": 1})


def test_symlink_loop_does_not_hang(tmp_path: Path):
    _touch(tmp_path, "a.png", "sub/b.png")
    (tmp_path / "sub" / "loop").symlink_to(tmp_path, target_is_directory=True)
    assert _rel(scan_images(tmp_path), tmp_path) == ["a.png", "sub/b.png"]


def test_missing_folder_raises_for_the_caller_to_report(tmp_path: Path):
    with pytest.raises(FileNotFoundError):
        scan_images(tmp_path / "nope")
    _touch(tmp_path, "file.png")
    with pytest.raises(NotADirectoryError):
        scan_images(tmp_path / "file.png")


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads every folder")
def test_unreadable_subfolder_is_reported(tmp_path: Path):
    _touch(tmp_path, "a.png", "locked/b.png")
    (tmp_path / "locked").chmod(0)
    try:
        problems: list = []
        assert _rel(scan_images(tmp_path, problems=problems), tmp_path) == ["a.png"]
        assert "locked" in problems[0].where and "cannot read folder" in problems[0].message
    finally:
        (tmp_path / "locked").chmod(0o755)


def test_scanning_thousands_of_files_lists_them_without_opening_them(tmp_path: Path):
    """Every file is empty, so a scan that opened one (to read a header) would drop it:
    listing is by name only, and its speed is bench/scan.py's to measure."""
    for d in range(20):
        folder = tmp_path / f"d{d:02d}"
        folder.mkdir()
        for i in range(250):
            (folder / f"{i:04d}.png").touch()
    found = scan_images(tmp_path)
    assert len(found) == 5000
    assert found[0] == tmp_path / "d00/0000.png" and found[-1] == tmp_path / "d19/0249.png"

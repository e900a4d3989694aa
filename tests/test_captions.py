"""Caption strategies, including the encodings and broken metadata users really have."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from core.data.captions import CaptionReader, caption_from_filename


def _image(root: Path, name: str) -> Path:
    path = root / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"not read by captions")
    return path


# ---------------------------------------------------------------- textfile


def test_textfile_utf8_with_bom_and_newlines(tmp_path: Path):
    img = _image(tmp_path, "cat.png")
    (tmp_path / "cat.txt").write_bytes(b"\xef\xbb\xbfa caf\xc3\xa9 cat,\r\n  sitting \n")
    assert CaptionReader(tmp_path, "textfile").caption_for(img) == ("a café cat, sitting", None)


def test_textfile_in_windows_1252_is_read_with_a_warning(tmp_path: Path):
    img = _image(tmp_path, "sub/dog.jpg")
    (tmp_path / "sub" / "dog.txt").write_bytes("a dog in a café – “smiling”".encode("cp1252"))
    text, problem = CaptionReader(tmp_path, "textfile").caption_for(img)
    assert text == "a dog in a café – “smiling”"
    assert problem is not None and problem.level == "warning"
    assert problem.where == str(tmp_path / "sub" / "dog.txt")
    assert "not UTF-8; read as Windows-1252" in problem.message


def test_textfile_bytes_undefined_in_1252_fall_back_to_latin1(tmp_path: Path):
    img = _image(tmp_path, "x.png")
    (tmp_path / "x.txt").write_bytes(b"caf\xe9 \x81")
    text, problem = CaptionReader(tmp_path, "textfile").caption_for(img)
    assert text == "café \x81" and "read as Latin-1" in problem.message


def test_textfile_utf16_from_notepad(tmp_path: Path):
    img = _image(tmp_path, "n.png")
    (tmp_path / "n.txt").write_bytes("a naïve caption".encode("utf-16"))  # BOM included
    assert CaptionReader(tmp_path, "textfile").caption_for(img) == ("a naïve caption", None)


def test_textfile_missing_or_empty_is_a_no_caption_warning(tmp_path: Path):
    reader = CaptionReader(tmp_path, "textfile")
    missing = _image(tmp_path, "lonely.png")
    text, problem = reader.caption_for(missing)
    assert text == "" and problem.where == str(missing)
    assert problem.message == "no caption: lonely.txt not found next to it"
    empty = _image(tmp_path, "blank.png")
    (tmp_path / "blank.txt").write_text("  \n\n")
    text, problem = reader.caption_for(empty)
    assert text == "" and problem.where.endswith("blank.txt")
    assert problem.message == "no caption: the file is empty"


# ---------------------------------------------------------------- filename


@pytest.mark.parametrize("name,caption", [
    ("red_circle.png", "red circle"),
    ("red-circle-02.jpg", "red circle"),
    ("red circle (2).png", "red circle"),
    ("a_blue__square_17.webp", "a blue square"),
    ("IMG_1234.JPG", "IMG"),
    ("0001.png", ""),
])
def test_filename_rule(name: str, caption: str):
    assert caption_from_filename(Path(name)) == caption


def test_filename_strategy_warns_when_no_words(tmp_path: Path):
    reader = CaptionReader(tmp_path, "filename")
    assert reader.caption_for(tmp_path / "a_dog.png") == ("a dog", None)
    text, problem = reader.caption_for(tmp_path / "0042.png")
    assert text == "" and "0042.png" in problem.where and "no caption" in problem.message


# ---------------------------------------------------------------- jsonl


def test_jsonl_good_bad_and_missing_entries(tmp_path: Path):
    a, b, c = (_image(tmp_path, n) for n in ("a.png", "sub/b.png", "c.png"))
    lines = [
        json.dumps({"file_name": "a.png", "text": "an apple"}),
        "{not json",
        "",
        json.dumps({"file_name": "./sub/b.png", "text": " a  bee\n"}),
        json.dumps(["a list"]),
        json.dumps({"file_name": "c.png", "caption": "wrong key"}),
        json.dumps({"file_name": "a.png", "text": "again"}),
        json.dumps({"file_name": "gone.png", "text": "a typo"}),
    ]
    (tmp_path / "metadata.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    reader = CaptionReader(tmp_path, "jsonl")
    meta = tmp_path / "metadata.jsonl"
    found = {p.where: p.message for p in reader.problems}
    assert found[f"{meta}:2"].startswith("not valid JSON")
    assert found[f"{meta}:5"] == "expected a JSON object; line ignored"
    assert found[f"{meta}:6"] == 'no "text" string (keys: caption, file_name); line ignored'
    assert "listed again" in found[f"{meta}:7"]
    assert all(p.level == "warning" for p in reader.problems) and len(reader.problems) == 4
    assert reader.caption_for(a) == ("an apple", None)
    assert reader.caption_for(b) == ("a bee", None)
    text, problem = reader.caption_for(c)
    assert text == "" and problem.where == str(c)
    assert problem.message == "no caption: 'c.png' is not listed in metadata.jsonl"
    (extra,) = reader.entries_without_image([a, b, c])
    assert extra.where == str(meta) and "'gone.png'" in extra.message


def test_jsonl_missing_file_is_one_error(tmp_path: Path):
    img = _image(tmp_path, "a.png")
    reader = CaptionReader(tmp_path, "jsonl")
    (problem,) = reader.problems
    assert problem.level == "error" and problem.where == str(tmp_path / "metadata.jsonl")
    assert 'caption = "jsonl" needs it' in problem.message
    assert reader.caption_for(img) == ("", None)  # no flood of per-image warnings


# ---------------------------------------------------------------- instance_prompt


def test_instance_prompt(tmp_path: Path):
    reader = CaptionReader(tmp_path, "instance_prompt", "a photo of  sks dog ")
    assert reader.caption_for(tmp_path / "x.png") == ("a photo of sks dog", None)
    text, problem = CaptionReader(tmp_path, "instance_prompt", "").caption_for(tmp_path / "x.png")
    assert text == "" and "instance_prompt is empty" in problem.message


def test_unknown_strategy_is_refused(tmp_path: Path):
    with pytest.raises(ValueError, match="unknown caption strategy 'exif'"):
        CaptionReader(tmp_path, "exif")

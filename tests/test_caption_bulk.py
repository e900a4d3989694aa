"""Many captions edited at once (core/caption/bulk.py through core.ops): each edit's
words, preview without writing, apply through the dataset's own caption files (.txt or
metadata.jsonl) and undo back to the same bytes; file-name captions refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import small_config

from core import ops
from core.caption.bulk import CaptionEdit, edited, tag_counts


def test_each_edit_changes_only_what_it_names():
    assert edited("a red circle, red", CaptionEdit("replace", "red", "blue")) == \
        "a blue circle, blue"
    assert edited("a circle", CaptionEdit("prepend", "sks")) == "sks, a circle"
    assert edited("sks, a circle", CaptionEdit("prepend", "sks")) == "sks, a circle"
    assert edited("a circle", CaptionEdit("append", "sks")) == "a circle, sks"
    assert edited("", CaptionEdit("prepend", "sks")) == "sks"
    assert edited("a, b, sks", CaptionEdit("remove_tag", "sks")) == "a, b"
    assert edited("sksx, b", CaptionEdit("remove_tag", "sks")) == "sksx, b"
    assert tag_counts(["a, b", "b, c", "b"]) == [("b", 3), ("a", 1), ("c", 1)]


def _files(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())
            if p.suffix in (".txt", ".jsonl")}


def test_textfile_preview_apply_and_undo(tmp_path: Path):
    cfg = small_config(tmp_path, images=3)
    folder = Path(cfg.datasets[0].images)
    (folder / "img_002.txt").unlink()  # an image without a caption gets one, then loses it
    before = _files(folder)
    edit = CaptionEdit("prepend", "sks")
    changes = ops.preview_caption_edit(cfg, tmp_path, 0, edit)
    assert [(c.image.name, c.after) for c in changes] == [
        ("img_000.png", "sks, dataset 0 image 0"), ("img_001.png", "sks, dataset 0 image 1"),
        ("img_002.png", "sks")]
    assert _files(folder) == before, "a preview writes nothing"
    undo = ops.apply_caption_edit(cfg, tmp_path, 0, edit)
    assert (folder / "img_002.txt").read_text() == "sks\n"
    assert ops.dataset_tags(cfg, tmp_path, 0)[0] == ("sks", 3)
    assert ops.preview_caption_edit(cfg, tmp_path, 0, edit) == []  # already there
    assert ops.undo_caption_edit(undo) == 3
    assert _files(folder) == before
    assert not list(folder.glob(".*.tmp"))


def test_jsonl_captions_are_edited_in_metadata_jsonl_and_undone(tmp_path: Path):
    cfg = small_config(tmp_path, images=2)
    folder = Path(cfg.datasets[0].images)
    for txt in folder.glob("*.txt"):
        txt.unlink()
    lines = [{"file_name": "img_000.png", "text": "a red circle", "score": 7},
             {"file_name": "./img_001.png", "text": "a red square"}]
    (folder / "metadata.jsonl").write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    cfg.datasets[0].caption = "jsonl"
    before = _files(folder)
    undo = ops.apply_caption_edit(cfg, tmp_path, 0, CaptionEdit("replace", "red", "blue"))
    rows = [json.loads(x) for x in (folder / "metadata.jsonl").read_text().splitlines()]
    assert rows == [{"file_name": "img_000.png", "text": "a blue circle", "score": 7},
                    {"file_name": "./img_001.png", "text": "a blue square"}]
    assert [p.name for p in folder.glob("*.txt")] == []
    ops.save_caption(cfg, tmp_path, str(folder / "img_001.png"), "by  hand")
    assert json.loads((folder / "metadata.jsonl").read_text().splitlines()[1])["text"] == \
        "by hand"
    # The editor opens an image's caption where its dataset reads it, not from a .txt.
    assert ops.read_caption(cfg, tmp_path, str(folder / "img_001.png")) == "by hand"
    assert ops.read_caption(cfg, tmp_path, str(folder / "img_000.png")) == "a blue circle"
    with pytest.raises(ops.OpError, match="click an image of the preview first"):
        ops.read_caption(cfg, tmp_path, str(tmp_path / "elsewhere.png"))
    ops.undo_caption_edit(undo)
    assert _files(folder) == before


def test_file_name_captions_and_an_empty_find_are_refused(tmp_path: Path):
    cfg = small_config(tmp_path, images=1)
    with pytest.raises(ops.OpError, match="type the text"):
        ops.preview_caption_edit(cfg, tmp_path, 0, CaptionEdit("replace", ""))
    cfg.datasets[0].caption = "filename"
    with pytest.raises(ops.OpError, match="reads its captions from file names"):
        ops.preview_caption_edit(cfg, tmp_path, 0, CaptionEdit("prepend", "sks"))
    with pytest.raises(ops.OpError, match="no dataset selected"):
        ops.preview_caption_edit(cfg, tmp_path, 3, CaptionEdit("prepend", "sks"))

"""Editing many captions at once (the Dataset tab's "Edit captions", through core.ops):
find and replace, a trigger word put first (or last) in every caption, a tag removed,
and the tags with their counts. Reads and writes through the dataset's own caption
strategy: textfile datasets a `.txt` beside each image, jsonl datasets their
`metadata.jsonl` (rewritten whole); file-name and instance-prompt captions are not
files to edit, and are refused.

Nothing is lost without asking: `plan_edit` only reads (the preview), `write_captions`
writes each file atomically (a temp name, then a rename) and returns a `CaptionUndo`
holding every file as it was, which `undo_captions` puts back.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from core.data.captions import METADATA_FILE, CaptionReader, normalise_name
from core.data.tags import split_tags
from core.files import write_bytes

EDITS = ("replace", "prepend", "append", "remove_tag")
EDITABLE = ("textfile", "jsonl")


@dataclass(frozen=True)
class CaptionEdit:
    """`kind`: replace (every `find` by `replace`, plain text), prepend/append (`find`,
    a trigger word or tag, put first/last unless a caption already has it as a tag),
    remove_tag (the comma-separated tag `find`, whole)."""

    kind: str
    find: str
    replace: str = ""


@dataclass(frozen=True)
class CaptionChange:
    image: Path
    before: str
    after: str


@dataclass
class CaptionUndo:
    """Every file a write changed, with its bytes before (None: it did not exist)."""

    files: dict[Path, bytes | None] = field(default_factory=dict)
    count: int = 0  # captions changed


def edited(caption: str, edit: CaptionEdit) -> str:
    """`caption` after `edit` (pure); whitespace collapsed as captions are read."""
    word = edit.find.strip()
    if edit.kind == "replace":
        return " ".join(caption.replace(edit.find, edit.replace).split()) if edit.find \
            else caption
    tags = split_tags(caption)
    if edit.kind in ("prepend", "append"):
        if not word or word in tags:
            return caption
        if not caption:
            return word
        return f"{word}, {caption}" if edit.kind == "prepend" else f"{caption}, {word}"
    if edit.kind == "remove_tag":
        kept = [t for t in tags if t != word]
        return ", ".join(kept) if len(kept) != len(tags) else caption
    raise ValueError(f"unknown caption edit {edit.kind!r}; one of {', '.join(EDITS)}")


def edit_problem(ds: Any, edit: CaptionEdit) -> str | None:
    """Why `edit` cannot run on dataset `ds` (a DatasetConfig, paths resolved), or None."""
    if ds.caption not in EDITABLE:
        return (f"dataset {ds.id!r} reads its captions from "
                f"{'file names' if ds.caption == 'filename' else 'its instance_prompt'}, "
                "not from files: there is nothing to edit here (edit the names or the "
                "prompt, or use caption = \"textfile\")")
    if edit.kind not in EDITS:
        return f"unknown edit {edit.kind!r}"
    if not edit.find.strip():
        return "type the text (or tag) to " + ("find" if edit.kind == "replace" else "use")
    return None


def read_captions(ds: Any, images: list[Path]) -> dict[Path, str]:
    """Each image's caption as training reads it ("" where it has none)."""
    reader = CaptionReader(ds.images, ds.caption, ds.instance_prompt)
    return {image: reader.caption_for(image)[0] for image in images}


def plan_edit(ds: Any, images: list[Path], edit: CaptionEdit) -> list[CaptionChange]:
    """The captions `edit` would change, before and after. Reads only."""
    return [CaptionChange(image, before, after)
            for image, before in read_captions(ds, images).items()
            if (after := edited(before, edit)) != before]


def tag_counts(captions: list[str]) -> list[tuple[str, int]]:
    """Every comma-separated tag with the number of captions that have it, most first."""
    counts = Counter(tag for caption in captions for tag in set(split_tags(caption)))
    return sorted(counts.items(), key=lambda item: (-item[1], item[0]))


def write_captions(ds: Any, captions: dict[Path, str]) -> CaptionUndo:
    """Write `captions` (image -> text) where dataset `ds` reads them, each file
    atomically; returns what undoes it. Refuses a dataset whose captions are no files."""
    if ds.caption not in EDITABLE:
        raise ValueError(edit_problem(ds, CaptionEdit("replace", "x")))
    undo = CaptionUndo(count=len(captions))
    if ds.caption == "textfile":
        for image, text in captions.items():
            _replace_file(image.with_suffix(".txt"), (" ".join(text.split()) + "\n")
                          .encode("utf-8"), undo)
    elif captions:
        path = Path(ds.images) / METADATA_FILE
        _replace_file(path, _jsonl_with(path, Path(ds.images), captions), undo)
    return undo


def undo_captions(undo: CaptionUndo) -> int:
    """Put every file back as it was before the write `undo` came from (a file that did
    not exist is removed); returns how many captions that restores."""
    for path, before in undo.files.items():
        if before is None:
            path.unlink(missing_ok=True)
        else:
            _write_atomic(path, before)
    return undo.count


def _replace_file(path: Path, data: bytes, undo: CaptionUndo) -> None:
    if path not in undo.files:
        undo.files[path] = path.read_bytes() if path.exists() else None
    _write_atomic(path, data)


def _write_atomic(path: Path, data: bytes) -> None:
    write_bytes(path, data)


def _jsonl_with(path: Path, root: Path, captions: dict[Path, str]) -> bytes:
    """metadata.jsonl with the `captions` of its images replaced (their other fields and
    every other line kept as they are) and lines added for images it did not list."""
    texts = {_relative(image, root): " ".join(text.split()) for image, text in captions.items()}
    lines = path.read_text(encoding="utf-8-sig").splitlines() if path.exists() else []
    out = []
    for line in lines:
        try:
            obj = json.loads(line)
        except json.JSONDecodeError:
            out.append(line)  # kept: the check names it
            continue
        name = obj.get("file_name") if isinstance(obj, dict) else None
        key = normalise_name(name) if isinstance(name, str) else None
        if key in texts:
            obj["text"] = texts.pop(key)
            line = json.dumps(obj, ensure_ascii=False)
        out.append(line)
    out += [json.dumps({"file_name": name, "text": text}, ensure_ascii=False)
            for name, text in texts.items()]
    return ("\n".join(out) + "\n").encode("utf-8")


def _relative(image: Path, root: Path) -> str:
    """`image`'s file_name in `root`'s metadata.jsonl ("/" separators)."""
    try:
        return image.relative_to(root).as_posix()
    except ValueError:  # the same file reached through another path (a symlink)
        return image.resolve().relative_to(root.resolve()).as_posix()

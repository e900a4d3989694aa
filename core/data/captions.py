"""Captions for dataset images, one strategy per dataset (`datasets.N.caption`).

- textfile: `<stem>.txt` next to the image. UTF-8 (a BOM is stripped); UTF-16 with a BOM
  is read too; anything else falls back to Windows-1252 (then Latin-1) with a warning.
- filename: the file's stem with "_" and "-" turned into spaces and a trailing copy
  counter removed: "red_circle_2.png", "red circle (2).png" and "red-circle-02.png" all
  give "red circle". A stem that is only digits ("0001.png") gives no caption.
- jsonl: `metadata.jsonl` at the dataset root, one JSON object a line with `file_name`
  (relative to the root, "/" separators) and `text` (the Hugging Face imagefolder layout).
- instance_prompt: the same prompt for every image (DreamBooth style).

In every strategy the caption's whitespace (newlines included) is collapsed to single
spaces. A missing or empty caption is a warning, never an error: the image trains with
an empty caption.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from core.problems import Problem, error, warning

METADATA_FILE = "metadata.jsonl"
_COPY_COUNTER = re.compile(r"(?:[ _-]*\(\d+\)|[ _-]+\d+)$")


def _clean(text: str) -> str:
    return " ".join(text.split())


def decode_text(data: bytes) -> tuple[str, str | None]:
    """Text of a caption file and, when it was not UTF-8, the encoding we guessed."""
    if data.startswith((b"\xff\xfe", b"\xfe\xff")):
        try:
            return data.decode("utf-16"), None
        except UnicodeDecodeError:
            pass
    try:
        return data.decode("utf-8-sig"), None
    except UnicodeDecodeError:
        pass
    try:
        return data.decode("cp1252"), "Windows-1252"
    except UnicodeDecodeError:
        return data.decode("latin-1"), "Latin-1"  # never fails: every byte is a character


def caption_from_filename(path: Path) -> str:
    """'red_circle-2' -> 'red circle'; see the module docstring for the rule."""
    stem = _COPY_COUNTER.sub("", path.stem)
    if stem.isdigit():
        return ""
    return _clean(stem.replace("_", " ").replace("-", " "))


class CaptionReader:
    """Reads captions for one dataset; `metadata.jsonl` is parsed once, at construction.

    `problems` holds what was found while loading (bad JSON lines, a missing
    metadata.jsonl); `caption_for` returns per-image problems alongside the caption.
    """

    def __init__(self, root: Path | str, strategy: str, instance_prompt: str = ""):
        self.root = Path(root)
        self.strategy = strategy
        self.instance_prompt = _clean(instance_prompt)
        self.problems: list[Problem] = []
        self._jsonl: dict[str, str] | None = None
        if strategy == "jsonl":
            self._jsonl = self._load_jsonl(self.root / METADATA_FILE)
        elif strategy not in ("textfile", "filename", "instance_prompt"):
            raise ValueError(f"unknown caption strategy {strategy!r}")

    @property
    def metadata_path(self) -> Path:
        return self.root / METADATA_FILE

    def caption_for(self, image: Path) -> tuple[str, Problem | None]:
        """(caption, problem or None). The caption is "" when there is none."""
        if self.strategy == "textfile":
            return self._from_textfile(image)
        if self.strategy == "filename":
            text = caption_from_filename(image)
            return text, None if text else warning(
                str(image), "no caption: the file name has no words; rename the file or "
                            "choose another caption strategy")
        if self.strategy == "jsonl":
            return self._from_jsonl(image)
        if not self.instance_prompt:
            return "", warning(str(image), "no caption: instance_prompt is empty")
        return self.instance_prompt, None

    def _from_textfile(self, image: Path) -> tuple[str, Problem | None]:
        txt = image.with_suffix(".txt")
        try:
            data = txt.read_bytes()
        except FileNotFoundError:
            return "", warning(str(image), f"no caption: {txt.name} not found next to it")
        except OSError as exc:
            return "", warning(str(txt), f"no caption: cannot read it ({exc.strerror or exc})")
        text, guessed = decode_text(data)
        text = _clean(text)
        if not text:
            return "", warning(str(txt), "no caption: the file is empty")
        if guessed:
            return text, warning(str(txt), f"not UTF-8; read as {guessed}. Check the caption "
                                           "and save the file as UTF-8")
        return text, None

    def _from_jsonl(self, image: Path) -> tuple[str, Problem | None]:
        if self._jsonl is None:  # the file is missing: one error was already reported
            return "", None
        rel = _relative_key(image, self.root)
        text = self._jsonl.get(rel)
        if text is None:
            return "", warning(str(image), f"no caption: {rel!r} is not listed in "
                                           f"{METADATA_FILE}")
        if not text:
            return "", warning(str(image), f"no caption: its text in {METADATA_FILE} is empty")
        return text, None

    def _load_jsonl(self, path: Path) -> dict[str, str] | None:
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            self.problems.append(error(str(path), 'not found, but caption = "jsonl" needs it; '
                                                  'create it (lines like {"file_name": "a.png", '
                                                  '"text": "..."}) or choose another caption '
                                                  "strategy"))
            return None
        except OSError as exc:
            self.problems.append(error(str(path), f"cannot read it ({exc.strerror or exc})"))
            return None
        text, guessed = decode_text(data)
        if guessed:
            self.problems.append(warning(str(path), f"not UTF-8; read as {guessed}. Save it "
                                                    "as UTF-8"))
        captions: dict[str, str] = {}
        for number, line in enumerate(text.splitlines(), start=1):
            if line.strip():
                self._parse_line(path, number, line, captions)
        return captions

    def _parse_line(self, path: Path, number: int, line: str, out: dict[str, str]) -> None:
        where = f"{path}:{number}"
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            self.problems.append(warning(where, f"not valid JSON ({exc.msg}); line ignored"))
            return
        if not isinstance(obj, dict):
            self.problems.append(warning(where, "expected a JSON object; line ignored"))
            return
        name, text = obj.get("file_name"), obj.get("text")
        if not isinstance(name, str) or not name.strip():
            self.problems.append(warning(where, 'no "file_name" string; line ignored'))
            return
        if not isinstance(text, str):
            keys = ", ".join(sorted(obj)) or "none"
            self.problems.append(warning(where, f'no "text" string (keys: {keys}); '
                                                "line ignored"))
            return
        key = normalise_name(name)
        if key in out:
            self.problems.append(warning(where, f"{name!r} is listed again; the first "
                                                "caption is kept"))
            return
        out[key] = _clean(text)

    def entries_without_image(self, images: list[Path]) -> list[Problem]:
        """Warnings for metadata.jsonl entries naming no scanned image (typos, moved files)."""
        if self._jsonl is None:
            return []
        seen = {_relative_key(p, self.root) for p in images}
        missing = [name for name in self._jsonl if name not in seen]
        if not missing:
            return []
        shown = ", ".join(repr(n) for n in missing[:5])
        more = f" and {len(missing) - 5} more" if len(missing) > 5 else ""
        return [warning(str(self.metadata_path),
                        f"{len(missing)} entries name no image in the folder: {shown}{more}")]


def normalise_name(name: str) -> str:
    """A metadata.jsonl file_name as the key it is looked up by."""
    name = name.strip().replace("\\", "/")
    while name.startswith("./"):
        name = name[2:]
    return name


def _relative_key(image: Path, root: Path) -> str:
    try:
        return image.relative_to(root).as_posix()
    except ValueError:
        return image.name

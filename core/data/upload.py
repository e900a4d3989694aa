"""Images a person uploads (in the browser) copied into a dataset folder of the workspace.

`<workspace>/datasets/<name>/` receives the images and their `.txt` captions (a caption
uploaded with the same stem as an image). Nothing already there is ever overwritten: a
name that is taken gets a numbered stem (`cat-2.png` with `cat-2.txt`), and the result
says so. Files that are not images are skipped and named. No gradio here: the UI passes
the uploaded files' paths.
"""

from __future__ import annotations

import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from core.data.images import IMAGE_EXTENSIONS

DATASETS_DIR = "datasets"  # under the workspace
CAPTION_SUFFIX = ".txt"


@dataclass
class UploadResult:
    folder: Path
    images: list[Path] = field(default_factory=list)
    captions: list[Path] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)  # "name (why)"
    renamed: list[tuple[str, str]] = field(default_factory=list)  # (uploaded, written)

    def notes(self) -> list[str]:
        """What happened, in plain words, for the person who uploaded."""
        out = [f"copied {len(self.images)} image(s) and {len(self.captions)} caption(s) "
               f"into {self.folder}"]
        if self.renamed:
            out.append("kept existing files; saved as new names: " + ", ".join(
                f"{a} -> {b}" for a, b in self.renamed))
        if self.skipped:
            out.append("skipped: " + ", ".join(self.skipped))
        return out


def dataset_name(text: str) -> str:
    """A folder and dataset id from what the person typed ("My cats!" -> "My-cats")."""
    name = re.sub(r"[^\w.-]+", "-", text.strip()).strip("-.")
    return name or "uploaded"


def upload_images(files: list[str | Path], workspace: str | Path, name: str) -> UploadResult:
    """Copy the uploaded images (and captions matched by stem) into
    `<workspace>/datasets/<name>/`, creating it; never overwrite a file there."""
    folder = Path(workspace).expanduser().absolute() / DATASETS_DIR / dataset_name(name)
    result = UploadResult(folder)
    paths = [Path(f) for f in files]
    images = [p for p in paths if p.suffix.lower() in IMAGE_EXTENSIONS]
    captions = {p.stem: p for p in paths if p.suffix.lower() == CAPTION_SUFFIX}
    image_stems = {p.stem for p in images}
    for p in paths:
        if p.suffix.lower() == CAPTION_SUFFIX and p.stem not in image_stems:
            result.skipped.append(f"{p.name} (no uploaded image named {p.stem}.*)")
        elif p.suffix.lower() not in (*IMAGE_EXTENSIONS, CAPTION_SUFFIX):
            result.skipped.append(f"{p.name} (not an image: "
                                  f"{', '.join(e.lstrip('.') for e in IMAGE_EXTENSIONS)})")
    if images:
        folder.mkdir(parents=True, exist_ok=True)
    for image in images:
        stem = _free_stem(folder, image.stem, image.suffix.lower())
        target = folder / f"{stem}{image.suffix.lower()}"
        _copy_new(image, target)
        result.images.append(target)
        if stem != image.stem:
            result.renamed.append((image.name, target.name))
        caption = captions.get(image.stem)
        if caption is not None:
            text_target = folder / f"{stem}{CAPTION_SUFFIX}"
            _copy_new(caption, text_target)
            result.captions.append(text_target)
    return result


def _free_stem(folder: Path, stem: str, suffix: str) -> str:
    """`stem`, or `stem-2`, `stem-3`... : the first whose image and caption names are both
    free (a caption must never land on another image's .txt)."""
    candidate, n = stem, 1
    while any((folder / f"{candidate}{s}").exists() for s in (suffix, CAPTION_SUFFIX)):
        n += 1
        candidate = f"{stem}-{n}"
    return candidate


def _copy_new(source: Path, target: Path) -> None:
    """Copy into a file that must not exist yet ('x' mode: never overwrites, even when
    another upload races for the same name)."""
    with source.open("rb") as src, target.open("xb") as dst:
        shutil.copyfileobj(src, dst)

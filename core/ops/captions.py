"""Captions: auto-captioning (the config it runs with, its check, starting it), one
caption written by hand (the Dataset tab's editor), and many edited at once (preview,
apply, undo, the tag counts: core/caption/bulk.py)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from core.caption.bulk import EDITS, CaptionEdit
from core.config import Config, DatasetConfig, resolved
from core.exits import EXIT_FAILED
from core.ops.errors import OpError
from core.problems import Problem, blocking, errors

__all__ = ["EDITS", "CaptionEdit", "apply_caption_edit", "caption_config",
           "check_captioning", "dataset_tags", "preview_caption_edit", "save_caption",
           "start_caption", "undo_caption_edit"]

if TYPE_CHECKING:
    from core.caption.bulk import CaptionChange, CaptionUndo
    from core.caption.job import CaptionJob


def caption_config(cfg: Config, dataset_ids: list[str] | None = None) -> Config:
    """`cfg` with `captioning.datasets` replaced by `dataset_ids` when given (the UI's
    selected dataset); `cfg` itself is not changed."""
    import dataclasses

    if dataset_ids is None:
        return cfg
    return dataclasses.replace(cfg, captioning=dataclasses.replace(
        cfg.captioning, datasets=list(dataset_ids)))


def check_captioning(cfg: Config, workspace: Path) -> list[Problem]:
    """The check `--stage caption` runs: the `[captioning]` keys and the datasets it
    writes to (not the diffusion model: captioning does not need it). Reads only."""
    from core.caption.plan import caption_problems

    return caption_problems(cfg, workspace)


def start_caption(cfg: Config, workspace: Path, *, running: CaptionJob | None = None,
                  extra_problems: list[Problem] | None = None) -> CaptionJob:
    """Start captioning under the run manager; returns at once (follow its handle).

    Errors of the check (`extra_problems`, the form's, first) refuse it, naming the key.
    `running` is the caller's current job: one at a time.
    """
    from core.caption.job import start_caption_job
    from core.runs.manager import RunStartError

    if running is not None and running.poll() is None:
        raise OpError(f"captioning is already running (log: {running.log_path}); wait for "
                      "it or stop it")
    found = errors([*(extra_problems or []), *check_captioning(cfg, workspace)])
    if found:
        raise OpError(blocking(len(found), "captioning"), found)
    try:
        return start_caption_job(cfg, workspace)
    except RunStartError as exc:
        raise OpError(str(exc), exit_code=EXIT_FAILED) from None


def save_caption(cfg: Config, workspace: Path, image: str, text: str) -> Path:
    """Write `text` (whitespace collapsed) as `image`'s caption, atomically, where its
    dataset reads it (a .txt beside it, or its metadata.jsonl); returns that file.

    `image` must be an image or clip inside the images folder of one of `cfg`'s
    datasets, any of them: the editor keeps the image it was opened on while another
    dataset is shown, so Save writes where the editor says instead of refusing and losing
    what was typed. Anything else is refused (no file is written outside the datasets)."""
    from core.caption.bulk import write_captions

    path, owner = _owner(cfg, workspace, image)
    try:
        undo = write_captions(owner, {path: text})
    except ValueError as exc:
        raise OpError(str(exc)) from None
    return next(iter(undo.files))


def read_caption(cfg: Config, workspace: Path, image: str) -> str:
    """`image`'s caption as its dataset reads it (its .txt, or its metadata.jsonl line),
    "" when it has none; refused as `save_caption` refuses."""
    from core.caption.bulk import read_captions

    path, owner = _owner(cfg, workspace, image)
    return read_captions(owner, [path]).get(path, "")


def _owner(cfg: Config, workspace: Path, image: str) -> tuple[Path, DatasetConfig]:
    """`image` and the dataset of `cfg` whose images folder holds it; OpError otherwise."""
    from core.data.images import IMAGE_EXTENSIONS
    from core.data.video import VIDEO_EXTENSIONS

    path = Path(image).expanduser() if image else None
    owner = None
    if path is not None and path.is_file() and \
            path.suffix.lower() in IMAGE_EXTENSIONS + VIDEO_EXTENSIONS:
        owner = next((ds for ds in resolved(cfg, workspace).datasets if ds.images.strip()
                      and path.resolve().is_relative_to(Path(ds.images).resolve())), None)
    if path is None or owner is None:
        why = f": {image} is not an image of this config's datasets" if image else ""
        raise OpError(f"click an image of the preview first{why}")
    return path, owner


# ---------------------------------------------------------------- many captions at once


def _dataset(cfg: Config, workspace: Path, index: int) -> tuple[DatasetConfig, list[Path]]:
    """Dataset `index` of `cfg` (paths resolved) and its images, as training lists them."""
    from core.data.index import index_dataset

    datasets = resolved(cfg, workspace).datasets
    if not 0 <= index < len(datasets):
        raise OpError("no dataset selected: add or select one first")
    ds = datasets[index]
    return ds, [item.path for item in index_dataset(ds, f"datasets.{index}").items]


def preview_caption_edit(cfg: Config, workspace: Path, index: int,
                         edit: CaptionEdit) -> list[CaptionChange]:
    """The captions of dataset `index` that `edit` would change, before and after;
    nothing is written. Refuses an edit that cannot run, saying why."""
    from core.caption.bulk import edit_problem, plan_edit

    ds, images = _dataset(cfg, workspace, index)
    problem = edit_problem(ds, edit)
    if problem:
        raise OpError(problem)
    return plan_edit(ds, images, edit)


def apply_caption_edit(cfg: Config, workspace: Path, index: int,
                       edit: CaptionEdit) -> CaptionUndo:
    """Write `edit` into dataset `index`'s captions (each file atomically); returns what
    `undo_caption_edit` needs to put every file back."""
    from core.caption.bulk import write_captions

    changes = preview_caption_edit(cfg, workspace, index, edit)
    ds, _ = _dataset(cfg, workspace, index)
    return write_captions(ds, {c.image: c.after for c in changes})


def undo_caption_edit(undo: CaptionUndo) -> int:
    """Every file of an applied edit back as it was; the number of captions restored."""
    from core.caption.bulk import undo_captions

    return undo_captions(undo)


def dataset_tags(cfg: Config, workspace: Path, index: int) -> list[tuple[str, int]]:
    """Dataset `index`'s comma-separated tags with how many captions hold each."""
    from core.caption.bulk import read_captions, tag_counts

    ds, images = _dataset(cfg, workspace, index)
    return tag_counts(list(read_captions(ds, images).values()))

"""Captions: auto-captioning (the config it runs with, its check, starting it) and one
caption written by hand (the Dataset tab's editor)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from core.config import Config, resolved
from core.exits import EXIT_FAILED
from core.files import write_text
from core.ops.errors import OpError
from core.problems import Problem, blocking, errors

if TYPE_CHECKING:
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
    """Write `text` (whitespace collapsed) to `image`'s .txt, atomically; returns it.

    `image` must be an image or clip inside the images folder of one of `cfg`'s
    datasets, any of them: the editor keeps the image it was opened on while another
    dataset is shown, so Save writes where the editor says instead of refusing and losing
    what was typed. Anything else is refused (no .txt is written outside the datasets)."""

    from core.data.images import IMAGE_EXTENSIONS
    from core.data.video import VIDEO_EXTENSIONS

    path = Path(image).expanduser() if image else None
    roots = [Path(ds.images).resolve() for ds in resolved(cfg, workspace).datasets
             if ds.images.strip()]
    if (path is None or not path.is_file()
            or path.suffix.lower() not in IMAGE_EXTENSIONS + VIDEO_EXTENSIONS
            or not any(path.resolve().is_relative_to(root) for root in roots)):
        why = f": {image} is not an image of this config's datasets" if image else ""
        raise OpError(f"click an image of the preview first{why}")
    target = path.with_suffix(".txt")
    write_text(target, " ".join(text.split()) + "\n")
    return target

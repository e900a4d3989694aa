"""Auto-captioning: the config it runs with, its check, starting it."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from core.config import Config
from core.exits import EXIT_FAILED
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

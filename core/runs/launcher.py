"""Start an `accelerate launch` child under the run manager: the one place that builds
the command of a training run (a launch, a resume, a queued run starting) and of a cache
build, starts it and renders it for command.txt and the UI's copy button."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from core.config import Config
from core.runs.command import build_accelerate_command, format_command
from core.runs.folder import RunFolder
from core.runs.manager import RunHandle, start_run


def start_accelerate(cfg: Config, folder: RunFolder, workspace: Path, *,
                     resume: str | None = None, script: list[str] | None = None,
                     registered: bool = True) -> tuple[RunHandle, str]:
    """Launch `cfg` writing into `folder` (its config.toml is what the child reads: a
    machine N > 0 of a multi-machine run has a folder of its own); the handle and the
    command line. `script` runs another program than the trainer (the cache builder);
    `registered` False keeps the child out of the workspace's run registry (jobs that
    are not training runs). Raises `RunStartError` when the child cannot start."""
    spec = build_accelerate_command(cfg, folder.root, workspace, resume=resume,
                                    script=script, config=folder.config)
    if not registered:
        spec = dataclasses.replace(spec, workspace=None)
    return start_run(spec, folder), format_command(spec)

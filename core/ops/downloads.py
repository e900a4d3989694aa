"""Downloads: what of a run the UI may serve (its config and LoRA files), the saved
LoRAs it lists and the TensorBoard command it shows."""

from __future__ import annotations

from pathlib import Path

from core.ops.errors import OpError
from core.runs.outputs import saved_loras, tensorboard_command

__all__ = ["run_downloads", "saved_loras", "tensorboard_command"]


def run_downloads(run_dir: Path, workspace: Path) -> list[Path]:
    """The run's config.toml and LoRA files (final, then by step, newest first), each
    checked to lie inside the workspace (what the UI may serve)."""
    from core.runs.outputs import downloadable_files, inside

    try:
        return [inside(workspace, p) for p in downloadable_files(run_dir)]
    except ValueError as exc:
        raise OpError(str(exc)) from None

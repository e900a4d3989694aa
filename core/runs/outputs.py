"""What a run has written for people to use: its saved LoRAs by step and the TensorBoard
command. The CLI summary, the Training tab and the Runs tab show these."""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path

from core.runs.folder import RunFolder, as_folder


@dataclass(frozen=True)
class SavedLora:
    """One intermediate LoRA folder (lora/step_NNNNNN/) and its files."""

    step: int
    folder: Path
    files: list[Path]


def saved_loras(where: RunFolder | str | Path) -> list[SavedLora]:
    """The complete intermediate LoRAs, oldest first."""
    return [SavedLora(step, path, sorted(path.glob("*.safetensors")))
            for step, path in as_folder(where).lora_steps()]


def tensorboard_command(where: RunFolder | str | Path) -> str | None:
    """`tensorboard --logdir <run>/tensorboard` when the run logs there (its folder exists,
    or its config turns logging.tensorboard on and the trainer has not started yet)."""
    folder = as_folder(where)
    if not folder.tensorboard.is_dir() and not _config_wants_tensorboard(folder):
        return None
    return f"tensorboard --logdir {shlex.quote(str(folder.tensorboard))}"


def _config_wants_tensorboard(folder: RunFolder) -> bool:
    from core.config import load_config

    try:
        return bool(load_config(folder.config).logging.tensorboard)
    except Exception:  # no config yet, an old or hand-edited one: no command to show
        return False


def downloadable_files(where: RunFolder | str | Path) -> list[Path]:
    """What a user takes away from a run: its config.toml, the final LoRA files (the
    diffusers file and the kohya/ComfyUI one beside it), each step's, newest first, then
    the merged model (`--stage merge`): its one-file checkpoint and merged/'s weights."""
    folder = as_folder(where)
    files = [folder.config] if folder.config.is_file() else []
    if folder.lora.is_dir():
        files += sorted(p for p in folder.lora.glob("*.safetensors") if p.is_file())
    for saved in reversed(saved_loras(folder)):
        files += saved.files
    if folder.merged_checkpoint.is_file():
        files.append(folder.merged_checkpoint)
    if folder.merged.is_dir():
        files += sorted(p for p in folder.merged.glob("*/*.safetensors") if p.is_file())
    return files


def inside(root: str | Path, path: str | Path) -> Path:
    """`path` resolved, when it is a file inside `root`; else ValueError. What the UI
    offers for download passes here, so no link ever leaves the workspace."""
    resolved = Path(path).resolve()
    if not resolved.is_relative_to(Path(root).resolve()):
        raise ValueError(f"{path} is outside the workspace ({root}); it is not served")
    if not resolved.is_file():
        raise ValueError(f"{path} is not a file")
    return resolved


# Where the merged folders' archives are made, inside the workspace (so they may be
# served) and out of the run folders (a run's files stay what the run wrote).
ARCHIVES = ".downloads"


def merged_archive_path(workspace: str | Path, run_dir: str | Path) -> Path:
    """`<workspace>/.downloads/<run, relative>/<run name>-merged.zip`: the run's merged/
    as one download (ops.merged_archive makes it); ValueError for a run outside."""
    root, run = Path(workspace).resolve(), Path(run_dir).resolve()
    if not run.is_relative_to(root) or run == root:
        raise ValueError(f"{run} is outside the workspace ({root}); it is not served")
    return root / ARCHIVES / run.relative_to(root) / f"{run.name}-merged.zip"

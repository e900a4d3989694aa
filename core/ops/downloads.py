"""Downloads: what of a run the UI may serve (its config and LoRA files, its merged
model as one archive), the saved LoRAs it lists and the TensorBoard command it shows."""

from __future__ import annotations

from pathlib import Path

from core.ops.errors import OpError
from core.runs.outputs import saved_loras, tensorboard_command

__all__ = ["merged_archive", "run_downloads", "saved_loras", "tensorboard_command"]


def run_downloads(run_dir: Path, workspace: Path) -> list[Path]:
    """The run's config.toml and LoRA files (final, then by step, newest first), each
    checked to lie inside the workspace (what the UI may serve)."""
    from core.runs.outputs import downloadable_files, inside

    try:
        return [inside(workspace, p) for p in downloadable_files(run_dir)]
    except ValueError as exc:
        raise OpError(str(exc)) from None


def merged_archive(run_dir: Path, workspace: Path) -> Path:
    """The run's merged/ folder whole, as one .zip (its files stored as they are, under
    `merged/`): `<workspace>/.downloads/<run, relative>/<run name>-merged.zip`, made on
    demand and made again when merged/ is newer (a merge replaced it). Refuses a run
    without merged/ or outside the workspace (nothing outside it is served)."""
    from core.runs.folder import RunFolder
    from core.runs.outputs import merged_archive_path

    merged = RunFolder(Path(run_dir).resolve()).merged
    if not merged.is_dir():
        raise OpError(f"{merged} does not exist; merge the run first")
    try:
        archive = merged_archive_path(workspace, merged.parent)
    except ValueError as exc:
        raise OpError(str(exc)) from None
    files = sorted(p for p in merged.rglob("*") if p.is_file())
    newest = max([merged.stat().st_mtime, *(p.stat().st_mtime for p in files)])
    if archive.is_file() and archive.stat().st_mtime >= newest:
        return archive
    _write_zip(archive, merged, files)
    return archive


def _write_zip(archive: Path, folder: Path, files: list[Path]) -> None:
    """`files` of `folder` into `archive` (written whole), named `<folder name>/...`;
    stored, not deflated: safetensors weights do not shrink, and big ones are quick."""
    import zipfile

    from core.files import atomic_path

    archive.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(archive, unique=(f".{archive.stem}-", ".tmp")) as tmp, \
            zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_STORED) as out:
        for path in files:
            out.write(path, f"{folder.name}/{path.relative_to(folder).as_posix()}")

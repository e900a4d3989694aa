"""Deleting a run folder: only a registered run of the workspace, inside it, not live,
and only when the caller confirms.

The run manager never deletes on its own; this is the one place a run folder is removed,
behind an explicit confirmation in the UI. Everything is checked before the first file
goes: a refusal leaves the folder whole.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from core.runs.folder import RunFolder
from core.runs.outputs import merged_archive_path
from core.runs.registry import list_runs, record_path
from core.runs.status import LIVE_STATES


class DeleteRefused(ValueError):
    """The run folder is not deleted; the message says why."""


def deletable_run(workspace: str | Path, run_dir: str | Path) -> Path:
    """The resolved folder when it may be deleted, else DeleteRefused.

    It must be a run of the workspace's registry, lie inside the workspace (never the
    workspace itself), not be a symbolic link, and its run must not be live (its
    processes gone, its state not starting/running/stopping)."""
    ws = Path(workspace).resolve()
    given = Path(run_dir)
    if given.is_symlink():
        raise DeleteRefused(f"{run_dir} is a symbolic link; delete it by hand")
    path = given.resolve()
    if path == ws or not path.is_relative_to(ws):
        raise DeleteRefused(f"{run_dir} is not inside the workspace ({ws}); only the "
                            "workspace's runs are deleted here")
    info = next((i for i in list_runs(ws) if i.run_dir.resolve() == path), None)
    if info is None or not RunFolder(path).holds_run():
        raise DeleteRefused(f"{run_dir} is not a run of this workspace")
    if info.alive or info.state in LIVE_STATES:
        raise DeleteRefused(f"{run_dir} is {info.state}; stop it before deleting it")
    return path


def delete_run(workspace: str | Path, run_dir: str | Path, *, confirm: bool) -> Path:
    """Remove the run folder and its registry record; returns the folder removed.

    `confirm` must be True (the user said yes to deleting this folder by name)."""
    path = deletable_run(workspace, run_dir)
    if not confirm:
        raise DeleteRefused(f"not deleted: confirm that {path} and everything in it "
                            "(checkpoints, LoRAs, images, logs) goes")
    shutil.rmtree(path)
    record_path(workspace, path).unlink(missing_ok=True)
    # Its merged/ as a download (.downloads/...) goes with it: made from the run's files.
    shutil.rmtree(merged_archive_path(workspace, path).parent, ignore_errors=True)
    return path

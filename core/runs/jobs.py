"""Folders of the workspace's jobs that are not training runs (cache builds, captioning):
`<workspace>/<jobs dir>/<stamp>/`, the newest few kept, each holding the config it ran."""

from __future__ import annotations

import shutil
import time
import uuid
from pathlib import Path

from core.config import Config, save_config
from core.runs.folder import RunFolder


def new_job_folder(cfg: Config, workspace: Path, jobs_dir: str, kind: str,
                   keep: int) -> RunFolder:
    """A fresh job folder of `kind` holding `cfg` as its config, after removing all but
    the newest `keep - 1` earlier ones (job folders are the app's own, never a user's)."""
    jobs = workspace / jobs_dir
    jobs.mkdir(parents=True, exist_ok=True)
    old = sorted((p for p in jobs.iterdir() if p.is_dir()), key=lambda p: p.name)
    for folder in old[:-(keep - 1)] if keep > 1 else old:
        shutil.rmtree(folder, ignore_errors=True)
    folder = RunFolder(jobs / f"{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}",
                       kind=kind)
    folder.root.mkdir()
    save_config(cfg, folder.config)
    return folder

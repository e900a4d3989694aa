"""An auto-captioning job: `python -m core.caption.main`, run by the run manager.

The UI's "Caption images" button and `--stage caption` both start it here, as a job
(core/runs/jobs.py), like a cache build: its own process group, a log, a clean stop and
an honest final state. Each job gets a folder `<workspace>/.caption-jobs/<stamp>/` (a
`RunFolder` of kind "caption"): the config it ran, `caption.log`, `events.jsonl` (its
progress) and `status.json`.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from core.config import Config
from core.runs.command import PROJECT_ROOT, LaunchSpec
from core.runs.jobs import BackgroundJob, new_job_folder
from core.runs.manager import start_run

JOBS_DIR = ".caption-jobs"
KEEP_JOBS = 5
CAPTION_MODULE = "core.caption.main"


@dataclass
class CaptionJob(BackgroundJob):
    done: int = 0
    total: int = 0
    skipped: int = 0

    def on_event(self, event: dict[str, Any], now: float) -> None:
        if event.get("type") == "caption_progress":
            self.done = int(event.get("done", 0))
            self.total = int(event.get("total", 0))
            self.skipped = int(event.get("skipped", 0))


def start_caption_job(cfg: Config, workspace: str | Path) -> CaptionJob:
    """Start captioning `cfg`'s datasets (paths as the user wrote them); returns at once."""
    workspace = Path(workspace).expanduser().absolute()
    folder = new_job_folder(cfg, workspace, JOBS_DIR, "caption", KEEP_JOBS)
    argv = [sys.executable, "-m", CAPTION_MODULE, "--config", str(folder.config),
            "--workspace", str(workspace), "--events", str(folder.events)]
    # The module is found by import from any working folder.
    path = os.pathsep.join(p for p in (str(PROJECT_ROOT), os.environ.get("PYTHONPATH", ""))
                           if p)
    spec = LaunchSpec(argv=argv, env={"PYTHONPATH": path, "PYTHONUNBUFFERED": "1"},
                      cwd=PROJECT_ROOT, workspace=None)
    return CaptionJob(handle=start_run(spec, folder))

"""An auto-captioning job: `python -m core.caption.main`, run by the run manager.

The UI's "Caption images" button and `--stage caption` both start it here, through
`core.runs.start_run`, so it gets its own process group, a log, a clean stop and an
honest final state, like a cache build (core/cache/job.py). Each job gets a folder
`<workspace>/.caption-jobs/<stamp>/` (a `RunFolder` of kind "caption"): the config it
ran, `caption.log`, `events.jsonl` (its progress) and `status.json`; the newest few are
kept. Jobs are not training runs, so they stay out of the run registry.
"""

from __future__ import annotations

import os
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path

from core.config import Config
from core.runs.command import PROJECT_ROOT, LaunchSpec
from core.runs.folder import RunFolder
from core.runs.jobs import new_job_folder
from core.runs.manager import RunHandle, start_run
from core.runs.tail import EventTail, last_lines

JOBS_DIR = ".caption-jobs"
KEEP_JOBS = 5
CAPTION_MODULE = "core.caption.main"


@dataclass
class CaptionJob:
    handle: RunHandle
    done: int = 0
    total: int = 0
    skipped: int = 0
    _events: EventTail | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @property
    def folder(self) -> RunFolder:
        return self.handle.folder

    @property
    def log_path(self) -> Path:
        return self.handle.folder.log

    def poll(self) -> str | None:
        """Read new progress events; the final state ("done", "failed", "stopped") or None.
        Thread-safe (a UI polls from its monitor thread and its handlers)."""
        with self._lock:
            if self._events is None:
                self._events = EventTail(self.folder.events)
            for event in self._events.read():
                if event.get("type") == "caption_progress":
                    self.done = int(event.get("done", 0))
                    self.total = int(event.get("total", 0))
                    self.skipped = int(event.get("skipped", 0))
            return self.handle.poll()

    def log_lines(self, n: int = 40) -> list[str]:
        return last_lines(self.log_path, n)

    def stop(self, grace_s: float = 10.0) -> str:
        with self._lock:
            return self.handle.stop(grace_s=grace_s).state


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

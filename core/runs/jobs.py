"""The workspace's jobs that are not training runs (cache builds, captioning): one job
type over the run manager, and their folders.

A job runs as a run does (its own process group, a log, a clean stop, an honest final
state: core/runs/manager.py), in `<workspace>/<jobs dir>/<stamp>/` (the newest few kept,
each holding the config it ran), and reports progress as events its kind reads
(`on_event`). Jobs stay out of the run registry.
"""

from __future__ import annotations

import shutil
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from core.config import Config, save_config
from core.runs.folder import RunFolder
from core.runs.manager import RunHandle
from core.runs.tail import EventTail, last_lines


@dataclass
class BackgroundJob:
    """A started job: poll it for progress and its final state, read its log, stop it.
    Thread-safe: a UI polls from its monitor thread and from request handlers."""

    handle: RunHandle
    _events: EventTail | None = field(default=None, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @property
    def folder(self) -> RunFolder:
        return self.handle.folder

    @property
    def log_path(self) -> Path:
        return self.handle.folder.log

    def on_event(self, event: dict[str, Any], now: float) -> None:
        """One progress event from the job's events.jsonl (`now`: monotonic time)."""

    def poll(self) -> str | None:
        """Read new progress events; the final state ("done", "failed", "stopped") or None."""
        with self._lock:
            if self._events is None:
                self._events = EventTail(self.folder.events)
            now = time.monotonic()
            for event in self._events.read():
                self.on_event(event, now)
            return self.handle.poll()

    def log_lines(self, n: int = 40) -> list[str]:
        return last_lines(self.log_path, n)

    def stop(self, grace_s: float = 10.0) -> str:
        with self._lock:
            return self.handle.stop(grace_s=grace_s).state


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

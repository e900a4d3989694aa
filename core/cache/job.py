"""A cache build: `accelerate launch -m core.cache.main`, run by the run manager.

The UI and `--stage cache` both start it here, as a job (core/runs/jobs.py): its own
process group, a log, a clean stop and an honest final state. Each build gets a job
folder `<workspace>/.cache-jobs/<stamp>/` (a `RunFolder` of kind "cache"): the config it
ran, `cache.log` (the program's output), `events.jsonl` (its progress lines) and
`status.json`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from core.config import Config
from core.runs.jobs import BackgroundJob, new_job_folder
from core.runs.launcher import start_accelerate

JOBS_DIR = ".cache-jobs"
KEEP_JOBS = 5
CACHE_MODULE = "core.cache.main"


@dataclass
class KindProgress:
    """Progress of one cache kind ("vae" or "text"), with a rate measured as it goes."""

    done: int = 0
    total: int = 0
    shares: dict[int, tuple[int, int]] = field(default_factory=dict)  # process: (done, total)
    first_seen: tuple[float, int] | None = None  # (monotonic time, done) at the first event
    last_seen: float = 0.0

    def eta_s(self) -> float | None:
        if self.first_seen is None or self.done >= self.total:
            return 0.0 if self.total and self.done >= self.total else None
        t0, done0 = self.first_seen
        elapsed, gained = self.last_seen - t0, self.done - done0
        if elapsed <= 0 or gained <= 0:
            return None
        return (self.total - self.done) * elapsed / gained


@dataclass
class CacheProgress:
    kinds: dict[str, KindProgress] = field(default_factory=dict)

    def update(self, event: dict[str, Any], now: float) -> None:
        if event.get("type") != "cache_progress":
            return
        kind = str(event.get("kind", "?"))
        entry = self.kinds.setdefault(kind, KindProgress())
        # Each process reports its own share of the work; the job's progress is their sum.
        share = (int(event.get("done", 0)), int(event.get("total", 0)))
        entry.shares[int(event.get("process", 0))] = share
        entry.done = sum(d for d, _ in entry.shares.values())
        entry.total = sum(t for _, t in entry.shares.values())
        if entry.first_seen is None:
            entry.first_seen = (now, entry.done)
        entry.last_seen = now


@dataclass
class CacheJob(BackgroundJob):
    started_at: float = field(default_factory=time.time)
    progress: CacheProgress = field(default_factory=CacheProgress)

    @property
    def job_dir(self) -> Path:
        return self.handle.folder.root

    def on_event(self, event: dict[str, Any], now: float) -> None:
        self.progress.update(event, now)


def start_cache_job(cfg: Config, workspace: str | Path) -> CacheJob:
    """Start building the caches of `cfg` (paths as the user wrote them); returns at once."""
    workspace = Path(workspace).expanduser().absolute()
    folder = new_job_folder(cfg, workspace, JOBS_DIR, "cache", KEEP_JOBS)
    handle, _ = start_accelerate(  # not a training run: no registry record
        cfg, folder, workspace, script=["--module", CACHE_MODULE, "--events",
                                        str(folder.events)], registered=False)
    return CacheJob(handle=handle)

"""The run queue of a workspace: runs prepared but waiting for the GPU, in order.

The web UI queues a launch while another run of its workspace is live (one GPU, one
run at a time); its monitor starts the first queued run once nothing is live
(`core.ops.start_next_queued`). `--no-ui` runs never queue.

- The order lives in `<workspace>/.queue.json` (`{"version": 1, "runs": [...]}`),
  replaced atomically, so it survives a restart of the app.
- A queued run's folder is prepared as for a start (config.toml written, or kept for a
  resume) and its status.json says `queued`; it is registered, so the Runs tab lists it.
- The state in status.json is the truth: an entry whose run no longer says `queued`
  (cancelled, deleted, started by hand with --resume) is skipped and dropped.
- Every change, and the check-then-start of the next run, happens under an exclusive
  lock on `<workspace>/.queue.lock` (flock), so two apps on one workspace, or the
  monitor and a click, never start two runs or lose an entry.

The order functions (`enqueued`, `without`, `moved`) are pure; the rest read or write.
"""

from __future__ import annotations

import contextlib
import fcntl
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from core.runs.registry import RunRecord, register_run
from core.runs.status import (
    RunStatus,
    append_event,
    read_json_file,
    read_status,
    write_json_atomic,
    write_status,
)

QUEUE_FILE = ".queue.json"
LOCK_FILE = ".queue.lock"
VERSION = 1


class QueueError(ValueError):
    """A queue action that cannot be done (the run is not queued, cannot move)."""


@dataclass(frozen=True)
class QueueEntry:
    """A queued run: its folder, and the checkpoint to resume from (None: a fresh start)."""

    run_dir: str
    resume: str | None = None
    queued_at: float = 0.0

    @classmethod
    def from_dict(cls, data: Any) -> QueueEntry | None:
        if not isinstance(data, dict) or not isinstance(data.get("run_dir"), str):
            return None
        resume = data.get("resume")
        queued_at = data.get("queued_at")
        return cls(run_dir=data["run_dir"],
                   resume=resume if isinstance(resume, str) else None,
                   queued_at=float(queued_at) if isinstance(queued_at, (int, float)) else 0.0)


# ---------------------------------------------------------------- pure order functions


def _key(run_dir: str | Path) -> str:
    return str(Path(run_dir).resolve())


def index_of(entries: list[QueueEntry], run_dir: str | Path) -> int:
    """The entry's place (0 = next), or -1."""
    key = _key(run_dir)
    return next((i for i, e in enumerate(entries) if _key(e.run_dir) == key), -1)


def enqueued(entries: list[QueueEntry], entry: QueueEntry) -> list[QueueEntry]:
    """`entry` last; a folder already queued is queued once (its old entry dropped)."""
    return [*without(entries, entry.run_dir), entry]


def without(entries: list[QueueEntry], run_dir: str | Path) -> list[QueueEntry]:
    key = _key(run_dir)
    return [e for e in entries if _key(e.run_dir) != key]


def moved(entries: list[QueueEntry], run_dir: str | Path, delta: int) -> list[QueueEntry]:
    """The order with the run moved `delta` places (-1: up, toward the start), clamped to
    the ends; QueueError when it is not queued."""
    i = index_of(entries, run_dir)
    if i < 0:
        raise QueueError(f"{run_dir} is not queued")
    out = list(entries)
    entry = out.pop(i)
    out.insert(max(0, min(len(out), i + delta)), entry)
    return out


# ---------------------------------------------------------------- the file


def queue_path(workspace: str | Path) -> Path:
    return Path(workspace) / QUEUE_FILE


def load_queue(workspace: str | Path) -> list[QueueEntry]:
    """The saved order; empty when the file is missing or unreadable (a corrupt file
    must not stop the app: the queued runs' status.json still says `queued`)."""
    data = read_json_file(queue_path(workspace)) or {}
    runs = data.get("runs") if isinstance(data.get("runs"), list) else []
    return [e for item in runs if (e := QueueEntry.from_dict(item)) is not None]


def save_queue(workspace: str | Path, entries: list[QueueEntry]) -> None:
    write_json_atomic(queue_path(workspace), {"version": VERSION,
                                              "runs": [vars(e) for e in entries]})


@contextlib.contextmanager
def queue_lock(workspace: str | Path) -> Iterator[None]:
    """Exclusive across processes and threads (each call opens its own descriptor)."""
    path = Path(workspace) / LOCK_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a", encoding="utf-8") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def is_queued(run_dir: str | Path) -> bool:
    status = read_status(run_dir)
    return status is not None and status.state == "queued"


def pending(workspace: str | Path) -> list[QueueEntry]:
    """The saved order, keeping only runs whose status.json still says `queued`."""
    return [e for e in load_queue(workspace) if is_queued(e.run_dir)]


# ---------------------------------------------------------------- actions (take the lock)


def queue_run(workspace: str | Path, run_dir: str | Path, resume: str | None) -> int:
    """Mark a prepared run folder `queued`, register it and put it last; returns its
    place (1 = next). Call with `queue_lock` held (the caller decided to queue under it).

    Progress of a resumed run (step, max_steps) is kept; the previous launch's identity
    is dropped, so nothing takes the old processes for this run's."""
    run_dir = Path(run_dir).resolve()
    old = read_status(run_dir) or RunStatus()
    now = round(time.time(), 3)
    write_status(run_dir, replace=True, state="queued", step=old.step,
                 max_steps=old.max_steps)
    append_event(run_dir, {"type": "status", "state": "queued", "step": old.step})
    register_run(workspace, RunRecord(run_dir=str(run_dir), started_at=now,
                                      command="(queued)"))
    entries = enqueued(pending(workspace), QueueEntry(str(run_dir), resume, now))
    save_queue(workspace, entries)
    return len(entries)


def cancel_queued(workspace: str | Path, run_dir: str | Path) -> None:
    """A queued run will not start: state `cancelled`, its entry dropped. Nothing is
    deleted (its folder and config.toml stay)."""
    with queue_lock(workspace):
        if not is_queued(run_dir):
            raise QueueError(_not_queued(run_dir))
        write_status(run_dir, state="cancelled", reason="cancelled before it started")
        append_event(run_dir, {"type": "status", "state": "cancelled",
                               "step": (read_status(run_dir) or RunStatus()).step,
                               "reason": "cancelled before it started"})
        save_queue(workspace, without(pending(workspace), run_dir))


def move_queued(workspace: str | Path, run_dir: str | Path, delta: int) -> list[QueueEntry]:
    """Move a queued run `delta` places (-1 up: sooner); returns the new order."""
    with queue_lock(workspace):
        if not is_queued(run_dir):
            raise QueueError(_not_queued(run_dir))
        entries = pending(workspace)
        if index_of(entries, run_dir) < 0:  # queued but lost from the file: append it
            entries.append(QueueEntry(str(Path(run_dir).resolve()), None, time.time()))
        entries = moved(entries, run_dir, delta)
        save_queue(workspace, entries)
        return entries


def _not_queued(run_dir: str | Path) -> str:
    status = read_status(run_dir)
    state = status.state if status and status.state else "unknown"
    return f"{run_dir} is not queued (its state is {state})"

"""The run queue of the web UI: runs waiting for the workspace's live run to end."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from core.ops.errors import OpError
from core.ops.runs import Launched, list_runs, saved_config
from core.runs.folder import RunFolder

if TYPE_CHECKING:
    from core.runs.queue import QueueEntry


def queue_entries(workspace: Path) -> list[QueueEntry]:
    """The queued runs in the order they will start, with when each was queued. Reads
    only."""
    from core.runs.queue import pending

    return pending(workspace)


def queued_runs(workspace: Path) -> list[Path]:
    """The queued runs in the order they will start. Reads only."""
    return [Path(e.run_dir) for e in queue_entries(workspace)]


def start_next_queued(workspace: Path) -> Launched | None:
    """Start the first queued run when no run of the workspace is live; None when there
    is nothing to start. The UI's monitor calls this every second (cheap when nothing is
    queued). A queued run that cannot start is recorded as failed, naming why, and the
    next one gets its turn at the next call."""
    from core.runs.queue import load_queue, pending, queue_lock, save_queue

    if not load_queue(workspace):
        return None
    with queue_lock(workspace):
        saved = load_queue(workspace)
        entries = pending(workspace)
        if entries != saved:  # drop what no longer says queued (cancelled, deleted)
            save_queue(workspace, entries)
        if not entries or any(i.alive for i in list_runs(workspace)):
            return None
        entry = entries[0]
        save_queue(workspace, entries[1:])
        return _start_queued(workspace, Path(entry.run_dir), entry.resume)


def _start_queued(workspace: Path, run_dir: Path, resume: str | None) -> Launched | None:
    from core.runs.launcher import start_accelerate
    from core.runs.manager import RunStartError
    from core.runs.status import append_event, read_status, write_status

    try:
        cfg = saved_config(run_dir)  # the config queued (a resume's: the run's own)
        handle, command = start_accelerate(cfg, RunFolder(run_dir), workspace, resume=resume)
    except (OpError, RunStartError) as exc:
        status = read_status(run_dir)
        if status is not None and status.state == "queued":
            reason = f"the queued run could not start: {exc}"
            write_status(run_dir, state="failed", reason=reason, finalized_by="manager")
            append_event(run_dir, {"type": "error", "step": status.step, "message": reason})
        return None
    return Launched(handle, command)


def cancel_queued(run_dir: Path, workspace: Path) -> None:
    """Take a queued run out of the queue: state `cancelled`; nothing is deleted."""
    from core.runs.queue import QueueError
    from core.runs.queue import cancel_queued as cancel

    try:
        cancel(workspace, run_dir)
    except QueueError as exc:
        raise OpError(str(exc)) from None


def move_queued(run_dir: Path, workspace: Path, delta: int) -> list[Path]:
    """Move a queued run `delta` places (-1: it starts sooner); the new order."""
    from core.runs.queue import QueueError
    from core.runs.queue import move_queued as move

    try:
        return [Path(e.run_dir) for e in move(workspace, run_dir, delta)]
    except QueueError as exc:
        raise OpError(str(exc)) from None

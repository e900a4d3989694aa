"""The run registry: one small JSON file per run under `<workspace>/.runs/`.

A restarted UI (or a second one) lists the runs of its workspace from here, finds the
ones still alive to follow them, and marks a dead run whose status.json still says
starting/running/stopping as failed (with a reason and an error event), so a crash of
the whole machine or a `kill -9` never leaves a run that "runs" forever.

One file per run (named by a hash of the run folder) keeps writes independent and
atomic: no shared file to lock, no global state. A resumed run replaces its record.
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from core.runs.procs import collect_run_processes, is_running
from core.runs.status import (
    FINAL_STATES,
    LIVE_STATES,
    LOG_FILE,
    STOP_FILE,
    append_event,
    read_json_file,
    write_json_atomic,
    write_status,
)
from core.runs.tail import last_lines, read_status

REGISTRY_DIR = ".runs"


@dataclass
class RunInfo:
    """What the UI shows for a run; `alive` means one of its processes still runs."""

    run_dir: Path
    state: str
    alive: bool
    pid: int | None = None
    started_at: float | None = None
    command: str = ""
    step: int | None = None
    max_steps: int | None = None
    eta_s: float | None = None
    reason: str = ""
    exit_code: int | None = None
    status: dict[str, Any] = field(default_factory=dict)


def run_id(run_dir: str | Path) -> str:
    return hashlib.sha1(str(Path(run_dir).resolve()).encode()).hexdigest()[:16]


def record_path(workspace: str | Path, run_dir: str | Path) -> Path:
    return Path(workspace) / REGISTRY_DIR / f"{run_id(run_dir)}.json"


def register_run(workspace: str | Path, record: dict[str, Any]) -> Path:
    """Write (or replace) the record of `record["run_dir"]`; returns its path."""
    path = record_path(workspace, record["run_dir"])
    write_json_atomic(path, record)
    return path


def launcher_identity(record: dict[str, Any] | None) -> tuple[int | None, int | None, str]:
    """(launcher pid, its start ticks, run token) from a registry record or status.json."""
    record = record or {}
    pid = record.get("launcher_pid", record.get("pid"))
    ticks = record.get("launcher_start", record.get("start_ticks"))
    token = record.get("run_token", record.get("token", ""))
    return (pid if isinstance(pid, int) else None,
            ticks if isinstance(ticks, int) else None,
            token if isinstance(token, str) else "")


def run_is_alive(record: dict[str, Any] | None, *, deep: bool = True) -> bool:
    """True when the launcher, or (`deep`) any process carrying the run's token, runs.

    The token scan (every process's environment) matters when the launcher died but an
    orphaned worker is still saving; it runs only when the launcher is gone, so a live
    run costs one stat. Callers skip it for runs already in a final state.
    """
    pid, ticks, token = launcher_identity(record)
    if pid is not None and ticks is not None and is_running(pid, ticks):
        return True
    return deep and bool(token) and bool(collect_run_processes(None, None, token))


def mark_dead_run_failed(run_dir: Path, status: dict[str, Any]) -> dict[str, Any]:
    """Record that a run's processes are gone while status.json said it was live."""
    pid = status.get("pid") or status.get("launcher_pid")
    tail = last_lines(run_dir / LOG_FILE, 1)
    reason = (f"the training process (pid {pid}) is gone but status.json still said "
              f"{status.get('state')!r}: it was killed or crashed; see {run_dir / LOG_FILE}")
    if tail:
        reason += f" (last line: {tail[-1].strip()[:200]})"
    new = write_status(run_dir, state="failed", reason=reason, finalized_by="manager")
    append_event(run_dir, {"type": "error", "step": status.get("step"), "message": reason})
    append_event(run_dir, {"type": "status", "state": "failed", "step": status.get("step")})
    return new


def run_info(run_dir: str | Path, record: dict[str, Any] | None = None) -> RunInfo:
    """Current state of one run, marking it failed if it died without saying so."""
    run_dir = Path(run_dir)
    status = read_status(run_dir) or {}
    record = record or status
    # status.json's launcher fields are written first at start (the registry record
    # after), so they name the newest launch of this folder; the record is the fallback.
    alive = run_is_alive(status if "launcher_pid" in status else record,
                         deep=status.get("state") not in FINAL_STATES)
    state = status.get("state") or ("starting" if alive else "failed")
    if not alive and state in LIVE_STATES:
        status = mark_dead_run_failed(run_dir, status)
        state = "failed"
    elif alive and state not in FINAL_STATES and (run_dir / STOP_FILE).exists():
        state = "stopping"
    return RunInfo(
        run_dir=run_dir,
        state=state,
        alive=alive,
        pid=launcher_identity(record)[0],
        started_at=record.get("started_at"),
        command=record.get("command", ""),
        step=status.get("step"),
        max_steps=status.get("max_steps"),
        eta_s=status.get("eta_s"),
        reason=status.get("reason") or status.get("error") or "",  # the trainer says "error"
        exit_code=status.get("exit_code"),
        status=status,
    )


def list_runs(workspace: str | Path) -> list[RunInfo]:
    """Every registered run of the workspace whose folder still exists, newest first."""
    folder = Path(workspace) / REGISTRY_DIR
    infos = []
    for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        record = read_json_file(path)
        if not record or not isinstance(record.get("run_dir"), str):
            continue
        run_dir = Path(record["run_dir"])
        if run_dir.is_dir():
            infos.append(run_info(run_dir, record))
    infos.sort(key=lambda info: info.started_at or 0.0, reverse=True)
    return infos


def live_runs(workspace: str | Path) -> list[RunInfo]:
    return [info for info in list_runs(workspace) if info.alive]


def new_record(run_dir: Path, pid: int, ticks: int | None, token: str,
               command: str) -> dict[str, Any]:
    return {
        "run_dir": str(Path(run_dir).resolve()),
        "pid": pid,
        "pgid": pid,  # the launcher leads its own session and group
        "start_ticks": ticks,
        "token": token,
        "started_at": round(time.time(), 3),
        "command": command,
    }

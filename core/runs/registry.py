"""The run registry: one small JSON file per run under `<workspace>/.runs/`.

A restarted UI (or a second one) lists the runs of its workspace from here and finds the
ones still alive to follow them. Listing only reads: a dead run whose status.json still
says starting/running/stopping is *shown* as failed, and `reconcile_run` (called
explicitly: by the UI at start and by a stop) records that in its folder, so a crash
of the whole machine or a `kill -9` never leaves a run that "runs" forever.

One file per run (named by a hash of the run folder) keeps writes independent and
atomic: no shared file to lock, no global state. A resumed run replaces its record.
The identity fields have the names status.json uses (`launcher_pid`, `launcher_start`,
`run_token`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from core.runs.folder import RunFolder
from core.runs.pids import collect_run_processes, is_running
from core.runs.status import (
    LIVE_STATES,
    RunStatus,
    append_event,
    read_json_file,
    read_status,
    write_json_atomic,
    write_status,
)
from core.runs.tail import last_lines

REGISTRY_DIR = ".runs"


@dataclass
class RunRecord:
    """A registry entry: which folder, and how to recognise its processes."""

    run_dir: str
    launcher_pid: int | None = None
    launcher_start: int | None = None
    run_token: str = ""
    started_at: float | None = None
    command: str = ""

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RunRecord | None:
        if not isinstance(data.get("run_dir"), str):
            return None
        status = RunStatus.from_dict(data)  # the identity fields share status.json's names
        return cls(run_dir=data["run_dir"], launcher_pid=status.launcher_pid,
                   launcher_start=status.launcher_start, run_token=status.run_token,
                   started_at=status.started_at, command=str(data.get("command", "")))


@dataclass
class RunInfo:
    """What the UI shows for a run; `alive` means one of its processes still runs.

    `state` is what the run is: a dead run whose status.json still says it is live is
    reported "failed" here even before `reconcile_run` writes that down."""

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
    status: RunStatus = field(default_factory=RunStatus)

    @property
    def dead_but_live(self) -> bool:
        """Its processes are gone while status.json still says it runs."""
        return not self.alive and self.status.state in LIVE_STATES


def run_id(run_dir: str | Path) -> str:
    return hashlib.sha1(str(Path(run_dir).resolve()).encode()).hexdigest()[:16]


def record_path(workspace: str | Path, run_dir: str | Path) -> Path:
    return Path(workspace) / REGISTRY_DIR / f"{run_id(run_dir)}.json"


def register_run(workspace: str | Path, record: RunRecord) -> Path:
    """Write (or replace) the record of `record.run_dir`; returns its path."""
    path = record_path(workspace, record.run_dir)
    write_json_atomic(path, vars(record))
    return path


def run_is_alive(identity: RunStatus | RunRecord | None, *, deep: bool = True) -> bool:
    """True when the launcher, or (`deep`) any process carrying the run's token, runs.

    The token scan (every process's environment) matters when the launcher died but an
    orphaned worker is still saving; it runs only when the launcher is gone, so a live
    run costs one stat. Callers skip it for runs already in a final state.
    """
    if identity is None:
        return False
    pid, ticks, token = identity.launcher_pid, identity.launcher_start, identity.run_token
    if pid is not None and ticks is not None and is_running(pid, ticks):
        return True
    return deep and bool(token) and bool(collect_run_processes(None, None, token))


def _dead_reason(folder: RunFolder, status: RunStatus) -> str:
    pid = status.pid or status.launcher_pid
    reason = (f"the training process (pid {pid}) is gone but status.json still said "
              f"{status.state!r}: it was killed or crashed; see {folder.log}")
    tail = last_lines(folder.log, 1)
    if tail:
        reason += f" (last line: {tail[-1].strip()[:200]})"
    return reason


def run_info(run_dir: str | Path, record: RunRecord | None = None) -> RunInfo:
    """Current state of one run. Reads only; see `reconcile_run`."""
    folder = RunFolder(Path(run_dir))
    status = read_status(folder.root) or RunStatus()
    # status.json's launcher fields are written first at start (the registry record
    # after), so they name the newest launch of this folder; the record is the fallback.
    identity: RunStatus | RunRecord | None = status if status.launcher_pid else record
    alive = run_is_alive(identity, deep=not status.final)
    state = status.state or ("starting" if alive else "failed")
    reason = status.reason
    if not alive and state in LIVE_STATES:
        state, reason = "failed", _dead_reason(folder, status)
    elif alive and not status.final and folder.stop_file.exists():
        state = "stopping"
    return RunInfo(
        run_dir=folder.root,
        state=state,
        alive=alive,
        pid=identity.launcher_pid if identity else None,
        started_at=record.started_at if record else status.started_at,
        command=record.command if record else "",
        step=status.step,
        max_steps=status.max_steps,
        eta_s=status.eta_s,
        reason=reason,
        exit_code=status.exit_code,
        status=status,
    )


def reconcile_run(info: RunInfo) -> RunInfo:
    """Write down that a dead run failed (status.json, an error and a status event).

    The one place that turns "its processes are gone" into a recorded final state;
    listing never does it. Returns the info unchanged when there is nothing to record.
    """
    if not info.dead_but_live:
        return info
    step = info.status.step
    status = write_status(info.run_dir, state="failed", reason=info.reason,
                          finalized_by="manager")
    append_event(info.run_dir, {"type": "error", "step": step, "message": info.reason})
    append_event(info.run_dir, {"type": "status", "state": "failed", "step": step})
    return dataclasses.replace(info, status=status)


def _records(workspace: str | Path) -> list[RunRecord]:
    folder = Path(workspace) / REGISTRY_DIR
    records = []
    for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        data = read_json_file(path)
        record = RunRecord.from_dict(data) if data else None
        if record is not None:
            records.append(record)
    return records


def list_runs(workspace: str | Path) -> list[RunInfo]:
    """Every registered run of the workspace whose folder still exists, newest first."""
    infos = [run_info(r.run_dir, r) for r in _records(workspace) if Path(r.run_dir).is_dir()]
    infos.sort(key=lambda info: info.started_at or 0.0, reverse=True)
    return infos


def reconcile_runs(workspace: str | Path) -> list[RunInfo]:
    """`list_runs`, recording every dead run that still said it was live as failed."""
    return [reconcile_run(info) for info in list_runs(workspace)]


def new_record(run_dir: Path, pid: int, ticks: int | None, token: str,
               command: str) -> RunRecord:
    return RunRecord(run_dir=str(Path(run_dir).resolve()), launcher_pid=pid,
                     launcher_start=ticks, run_token=token,
                     started_at=round(time.time(), 3), command=command)

"""status.json as a typed record, and the writers for status.json and events.jsonl.

The trainer (rank 0) and the run manager both use these, so the files have one format:

- `status.json` is replaced atomically (temp file + rename), so a reader never sees half
  a file. `write_status` *merges* the given fields into what is there: the manager's
  launcher fields survive the trainer's per-step updates. Only `RunStatus` fields are
  accepted, so a misspelt field is an error, not a silent second name.
- `events.jsonl` gets one JSON object per line, each appended with a single write to a
  file opened in append mode, so concurrent readers see whole lines or a partial last
  line (which `core.runs.tail.EventTail` leaves for its next read).

Only the standard library is imported here: the trainer imports it before torch.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from core.exits import EXIT_FAILED, EXIT_OK, EXIT_STOPPED
from core.files import write_json
from core.runs.folder import RunFolder

# "queued": prepared, waiting in the workspace's run queue (core/runs/queue.py) for the
# runs before it to end; "cancelled": taken out of the queue before it ever started.
STATES = ("queued", "starting", "running", "stopping", "done", "failed", "stopped",
          "cancelled")
FINAL_STATES = ("done", "failed", "stopped", "cancelled")
LIVE_STATES = ("starting", "running", "stopping")
EVENT_TYPES = ("step", "eval", "validation", "checkpoint", "status", "error", "memory",
               "resume", "lora_saved", "extend", "quantized", "block_swap", "startup",
               "compile", "token_routing")


@dataclass
class RunStatus:
    """What status.json holds. The identity fields (`launcher_pid`, `launcher_start`,
    `run_token`) have the same names in the run registry's records."""

    state: str | None = None
    pid: int | None = None  # the trainer's main process once it runs, else the launcher
    step: int | None = None
    max_steps: int | None = None
    eta_s: float | None = None
    it_s: float | None = None
    loss: float | None = None
    phase: str | None = None
    processes: int | None = None
    reason: str = ""  # why the run failed or stopped; the one message field
    exit_code: int | None = None
    stop_forced: bool | None = None
    finalized_by: str | None = None  # "manager" when the run manager decided the state
    launcher_pid: int | None = None
    launcher_start: int | None = None  # the launcher's start time in clock ticks
    run_token: str = ""
    started_at: float | None = None
    updated_at: float | None = None

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RunStatus:
        """Known fields only: a newer writer's extra fields do not break an older reader."""
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names and v is not None})

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @property
    def final(self) -> bool:
        return self.state in FINAL_STATES


STATUS_FIELDS = frozenset(f.name for f in dataclasses.fields(RunStatus))

# Exit codes of the CLI contract, by final state.
_EXIT_BY_STATE = {"done": EXIT_OK, "failed": EXIT_FAILED, "stopped": EXIT_STOPPED}


def exit_code_for_state(state: str | None) -> int:
    """The CLI exit code for a run's final state: 0 done, 130 stopped, 1 anything else."""
    return _EXIT_BY_STATE.get(state or "", EXIT_FAILED)


def _finite(value: Any) -> Any:
    """NaN/inf become null: strict JSON (jq, browsers) rejects them, Python would not."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def read_json_file(path: Path) -> dict[str, Any] | None:
    """A JSON object from `path`, or None when it is missing, unreadable or not an object."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def write_json_atomic(path: Path, data: dict[str, Any]) -> None:
    """Write to a temp name unique to this process, then rename over `path`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json(path, _finite(data), temp=f".{path.name}.{os.getpid()}.tmp")


def read_status(run_dir: str | Path) -> RunStatus | None:
    """status.json, or None when it is missing, partial or not an object."""
    data = read_json_file(RunFolder(Path(run_dir)).status)
    return None if data is None else RunStatus.from_dict(data)


def write_status(run_dir: str | Path, *, replace: bool = False, **fields: Any) -> RunStatus:
    """Merge `fields` into `<run_dir>/status.json` (atomically) and return the new status.

    `replace=True` drops the fields already there. Every field must be a `RunStatus`
    field; `state`, when given, one of STATES. `updated_at` is set on every write.
    """
    unknown = sorted(set(fields) - STATUS_FIELDS)
    if unknown:
        raise ValueError(f"unknown status.json field(s) {', '.join(unknown)}; expected "
                         f"fields of RunStatus")
    state = fields.get("state")
    if state is not None and state not in STATES:
        raise ValueError(f"unknown run state {state!r}; expected one of {', '.join(STATES)}")
    path = RunFolder(Path(run_dir)).status
    data = {} if replace else (read_json_file(path) or {})
    data.update(fields)
    data["updated_at"] = round(time.time(), 3)
    data = {k: v for k, v in data.items() if v is not None and v != ""}
    write_json_atomic(path, data)
    return RunStatus.from_dict(data)


def append_event(run_dir: str | Path, event: dict[str, Any], *, fsync: bool = False) -> None:
    """Append one event as a JSON line to `<run_dir>/events.jsonl`.

    `type` is required (one of EVENT_TYPES); `time` is added when missing. One `write`
    of the whole line on an O_APPEND file keeps lines whole for readers.
    """
    kind = event.get("type")
    if kind not in EVENT_TYPES:
        raise ValueError(f"event type must be one of {', '.join(EVENT_TYPES)}; got {kind!r}")
    record = dict(event)
    record.setdefault("time", round(time.time(), 3))
    line = json.dumps(_finite(record), allow_nan=False, ensure_ascii=False) + "\n"
    path = RunFolder(Path(run_dir)).events
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode("utf-8"))
        if fsync:
            os.fsync(fd)
    finally:
        os.close(fd)


def stop_requested(run_dir: str | Path) -> bool:
    """True when the soft-stop file exists; the trainer checks this once per step."""
    return RunFolder(Path(run_dir)).stop_file.exists()

"""Writers for a run folder's status.json and events.jsonl (see DESIGN.md, run folder).

The trainer (rank 0) and the run manager both use these, so the files have one format:

- `status.json` is replaced atomically (temp file + rename), so a reader never sees half
  a file. `write_status` *merges* the given fields into what is there: the manager's
  launcher fields (`launcher_pid`, ...) survive the trainer's per-step updates.
- `events.jsonl` gets one JSON object per line, each appended with a single write to a
  file opened in append mode, so concurrent readers see whole lines or a partial last
  line (which `core.runs.tail.EventTail` leaves for its next read).

Only the standard library is imported here: the trainer imports it before torch.
"""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path
from typing import Any

STATUS_FILE = "status.json"
EVENTS_FILE = "events.jsonl"
LOG_FILE = "train.log"
CONFIG_FILE = "config.toml"
COMMAND_FILE = "command.txt"
STOP_FILE = "STOP"

STATES = ("starting", "running", "stopping", "done", "failed", "stopped")
FINAL_STATES = ("done", "failed", "stopped")
LIVE_STATES = ("starting", "running", "stopping")
EVENT_TYPES = ("step", "eval", "validation", "checkpoint", "status", "error")

# Exit codes of the CLI contract, by final state.
EXIT_CODES = {"done": 0, "failed": 1, "stopped": 130}


def exit_code_for_state(state: str | None) -> int:
    """The CLI exit code for a run's final state: 0 done, 130 stopped, 1 anything else."""
    return EXIT_CODES.get(state or "", 1)


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
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(_finite(data), indent=1, allow_nan=False) + "\n",
                   encoding="utf-8")
    os.replace(tmp, path)


def write_status(run_dir: str | Path, *, replace: bool = False, **fields: Any) -> dict[str, Any]:
    """Merge `fields` into `<run_dir>/status.json` (atomically) and return the new content.

    `replace=True` drops the fields already there. `state`, when given, must be one of
    STATES. `updated_at` (epoch seconds) is set on every write.
    """
    state = fields.get("state")
    if state is not None and state not in STATES:
        raise ValueError(f"unknown run state {state!r}; expected one of {', '.join(STATES)}")
    path = Path(run_dir) / STATUS_FILE
    data = {} if replace else (read_json_file(path) or {})
    data.update(fields)
    data["updated_at"] = round(time.time(), 3)
    write_json_atomic(path, data)
    return data


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
    path = Path(run_dir) / EVENTS_FILE
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
    return (Path(run_dir) / STOP_FILE).exists()

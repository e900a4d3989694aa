"""Run manager: builds the accelerate command, owns the child's process group, keeps the
run registry, tails logs and events, stops and resumes runs (docs/run-folder.md).

Only the standard library and core.config are imported here: no torch, so the CLI's
`--help` and `--stage check` paths stay fast.
"""

from __future__ import annotations

from core.runs.command import LaunchSpec, build_accelerate_command, format_command
from core.runs.final_state import decide_final_state, finalize_run
from core.runs.folder import RunFolder
from core.runs.foreground import follow_run
from core.runs.manager import (
    RunHandle,
    RunStartError,
    StopResult,
    attach,
    request_stop,
    start_run,
    stop_run,
)
from core.runs.prepare import RunDirError, prepare_run_dir
from core.runs.registry import (
    RunInfo,
    list_runs,
    reconcile_run,
    reconcile_runs,
    run_info,
    run_is_alive,
)
from core.runs.status import (
    FINAL_STATES,
    STATES,
    RunStatus,
    append_event,
    exit_code_for_state,
    read_status,
    write_status,
)
from core.runs.tail import EventTail, LogTail, collapse_cr

__all__ = [
    "FINAL_STATES", "STATES", "EventTail", "LaunchSpec", "LogTail", "RunDirError",
    "RunFolder", "RunHandle", "RunInfo", "RunStartError", "RunStatus", "StopResult",
    "append_event", "attach", "build_accelerate_command", "collapse_cr", "decide_final_state",
    "exit_code_for_state", "finalize_run", "follow_run", "format_command", "list_runs",
    "prepare_run_dir", "read_status", "reconcile_run", "reconcile_runs", "request_stop",
    "run_info", "run_is_alive", "start_run", "stop_run", "write_status",
]

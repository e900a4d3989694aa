"""How a run ended, decided from the exit code and what the trainer wrote, never assumed,
and recorded in status.json and events.jsonl (`finalize_run`)."""

from __future__ import annotations

import json
import signal

from core.runs import pids
from core.runs.folder import FolderKind, RunFolder
from core.runs.status import RunStatus, append_event, read_status, write_status
from core.runs.tail import last_lines

STEP_EVENTS_READ = 200  # events from the end searched for the last step event


def _describe_exit(returncode: int | None) -> str:
    if returncode is None:
        return "ended (exit code unknown: it was not started by this process)"
    if returncode < 0:
        return f"was killed by {pids.signal_name(returncode)}"
    return f"exited with code {returncode}"


# What a forced stop leaves, and the process's name, by folder kind: a cache build or
# captioning job has no checkpoint, and its entries and captions are written whole.
_KILLED_LEAVES = {"train": "the last checkpoint may be older than the last step",
                  "cache": "the cache entries written so far are kept, each whole",
                  "caption": "the captions written so far are kept"}
_PROCESS = {"train": "training", "cache": "cache build", "caption": "captioning"}


def decide_final_state(
    returncode: int | None,
    status: RunStatus | None,
    *,
    stop_requested: bool = False,
    forced: bool = False,
    log: str = "its log",
    kind: FolderKind = "train",
) -> tuple[str, str]:
    """(state, reason) for a run (or a `kind` job) whose processes have all ended; a
    failure's reason points at `log`.

    A final state the trainer wrote itself is kept, except "done" with a failing exit
    code when nobody asked it to stop (one rank may have crashed). Otherwise the exit
    code decides: 0 done, 130 or SIGINT stopped, a stop we asked for stopped (noting
    when it had to be forced), anything else failed. The launcher turns a trainer's
    130 into 1, which is why the trainer's own "stopped" is trusted.
    """
    status = status or RunStatus()
    trainer_state = None if status.finalized_by == "manager" else status.state
    if trainer_state in ("failed", "stopped"):
        return trainer_state, status.reason
    if trainer_state == "done":
        if returncode in (0, None) or stop_requested:
            return "done", ""
        return "failed", (f"the trainer reported done but the launcher "
                          f"{_describe_exit(returncode)}; see {log}")
    if returncode == 0:
        return "done", ""
    if returncode in (130, -signal.SIGINT):
        return "stopped", "stopped by the user"
    if stop_requested:
        if forced:
            return "stopped", ("stopped by the user; it did not exit within the grace "
                               f"period and was killed, so {_KILLED_LEAVES[kind]}")
        return "stopped", "stopped by the user"
    return "failed", f"the {_PROCESS[kind]} process {_describe_exit(returncode)}; see {log}"


def last_step_event(folder: RunFolder) -> int | None:
    """The step of the newest `step` event in events.jsonl (read from its end), or None."""
    for line in reversed(last_lines(folder.events, STEP_EVENTS_READ)):
        try:
            event = json.loads(line)
        except ValueError:  # a line cut by the read's start or a crash
            continue
        if isinstance(event, dict) and event.get("type") == "step":
            return int(event.get("step", 0))
    return None


def finalize_run(
    folder: RunFolder,
    returncode: int | None,
    *,
    stop_requested: bool = False,
    forced: bool = False,
    failure: str = "",
) -> str:
    """Decide the final state and record it in status.json and events.jsonl.

    `failure` replaces the reason of a failure the trainer did not report itself (the
    manager knows better, e.g. that the other machines never joined)."""
    status = read_status(folder.root) or RunStatus()
    state, reason = decide_final_state(returncode, status, stop_requested=stop_requested,
                                       forced=forced, log=str(folder.log), kind=folder.kind)
    if state == "failed" and failure and status.state != "failed":
        reason = failure
    if state == "failed":
        tail = last_lines(folder.log, 1)
        if tail and "last line:" not in reason:
            reason += f" (last line: {tail[-1].strip()[:200]})"
    stop_forced = True if forced else None
    step = last_step_event(folder)
    if step is not None and step > (status.step or 0):  # status.json is written at most
        write_status(folder.root, step=step)  # once a second; events at every step
        status.step = step
    if status.state == state and status.finalized_by != "manager":
        # the trainer said it already; add the exit code
        write_status(folder.root, exit_code=returncode, stop_forced=stop_forced)
        return state
    already = status.state == state  # e.g. a reconcile marked it failed first
    write_status(folder.root, state=state, reason=reason, finalized_by="manager", eta_s=None,
                 exit_code=returncode, stop_forced=stop_forced)
    if not already:
        if state == "failed":
            append_event(folder.root, {"type": "error", "step": status.step,
                                       "message": reason})
        append_event(folder.root, {"type": "status", "state": state, "step": status.step,
                                   "reason": reason})
    return state

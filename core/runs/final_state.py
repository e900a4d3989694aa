"""How a run ended, decided from the exit code and what the trainer wrote, never assumed,
and recorded in status.json and events.jsonl (`finalize_run`)."""

from __future__ import annotations

import json
import signal

from core.exits import SIGNAL_EXIT_BASE
from core.runs import pids
from core.runs.folder import FolderKind, RunFolder
from core.runs.memory import format_memory
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
# What SIGKILL most often means, and what needs less memory, by folder kind.
_OOM_KILLER = {
    # SIGKILL from the kernel means host RAM, not the GPU's (that is an error the trainer
    # reports itself): more swapped blocks would pin more of it.
    "train": "often the out-of-memory killer: this machine's RAM ran out; the check's host "
             "memory line says what the run holds: pin fewer blocks (a smaller "
             "model.blocks_to_swap), run fewer processes, or add RAM or swap space",
    "cache": "often the out-of-memory killer: this machine's RAM ran out (the model is read "
             "into it whole); run fewer processes, or add RAM or swap space",
    "caption": "often the out-of-memory killer"}


def killing_signal(returncode: int | None) -> int | None:
    """The signal that ended the run's process: -N from a process run directly, 128 + N
    from accelerate's launcher as the run manager starts it (core/runs/accelerate_launch.py);
    None for an exit of its own. SIGINT is a stop, not a kill (130)."""
    if returncode is None:
        return None
    if returncode < 0:
        signum = -returncode
    elif SIGNAL_EXIT_BASE < returncode < SIGNAL_EXIT_BASE + 65:
        signum = returncode - SIGNAL_EXIT_BASE
    else:
        return None
    return None if signum == signal.SIGINT else signum


def killed_reason(signum: int, kind: FolderKind = "train", where: str = "",
                  log: str = "its log") -> str:
    """"the training process was killed by signal 9 (often the out-of-memory killer:
    ...)" and `where` (the last step, the memory peak) before "; see <log>"."""
    try:
        name = signal.Signals(signum).name
    except ValueError:
        name = f"signal {signum}"
    why = _OOM_KILLER[kind] if signum == signal.SIGKILL else name
    return f"the {_PROCESS[kind]} process was killed by signal {signum} ({why}){where}; see {log}"


def where_it_ended(folder: RunFolder) -> str:
    """" at step 3/100; memory: peak ..." from events.jsonl (status.json may lag)."""
    status = read_status(folder.root) or RunStatus()
    step = last_step_event(folder)
    step = step if step is not None else status.step
    text = (f" at step {step}/{status.max_steps or '?'}" if step else
            " before its first step")
    memory = format_memory(memory_events(folder))
    return text + (f"; {memory}" if memory else "")


def memory_events(folder: RunFolder) -> list[dict]:
    """The `memory` events of events.jsonl (read line by line: a long run's file holds a
    line per step)."""
    events: list[dict] = []
    try:
        with open(folder.events, encoding="utf-8", errors="replace") as lines:
            for line in lines:
                if '"memory"' not in line:
                    continue
                try:
                    event = json.loads(line)
                except ValueError:
                    continue
                if isinstance(event, dict) and event.get("type") == "memory":
                    events.append(event)
    except OSError:
        return []
    return events


def decide_final_state(
    returncode: int | None,
    status: RunStatus | None,
    *,
    stop_requested: bool = False,
    forced: bool = False,
    log: str = "its log",
    kind: FolderKind = "train",
    where: str = "",
) -> tuple[str, str]:
    """(state, reason) for a run (or a `kind` job) whose processes have all ended; a
    failure's reason points at `log`.

    A final state the trainer wrote itself is kept, except "done" with a failing exit
    code when nobody asked it to stop (one rank may have crashed). Otherwise the exit
    code decides: 0 done, 130 or SIGINT stopped, a stop we asked for stopped (noting
    when it had to be forced), anything else failed. The launcher turns a trainer's
    130 into 1, which is why the trainer's own "stopped" is trusted. A process killed
    by a signal nobody asked for fails the run, saying so (`where`: its last step and
    memory), whatever the other processes wrote: torchrun stops the other ranks with
    SIGTERM when one is killed, and they then say "stopped".
    """
    status = status or RunStatus()
    signum = killing_signal(returncode)
    if signum is not None and not stop_requested:
        return "failed", killed_reason(signum, kind, where, log)
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
    killed = killing_signal(returncode) is not None and not stop_requested
    where = where_it_ended(folder) if killed else ""
    state, reason = decide_final_state(returncode, status, stop_requested=stop_requested,
                                       forced=forced, log=str(folder.log), kind=folder.kind,
                                       where=where)
    if state == "failed" and failure and status.state != "failed" and not killed:
        reason = failure
    if state == "failed" and not killed:
        tail = last_lines(folder.log, 1)
        if tail and "last line:" not in reason:
            reason += f" (last line: {tail[-1].strip()[:200]})"
    stop_forced = True if forced else None
    step = last_step_event(folder)
    if step is not None and step > (status.step or 0):  # status.json is written at most
        write_status(folder.root, step=step)  # once a second; events at every step
        status.step = step
    if status.state == state and status.finalized_by != "manager" and not killed:
        # the trainer said it already; add the exit code
        write_status(folder.root, exit_code=returncode, stop_forced=stop_forced)
        return state
    # e.g. a reconcile marked it failed first; a kill's reason is news all the same
    already = status.state == state and (not killed or status.reason == reason)
    write_status(folder.root, state=state, reason=reason, finalized_by="manager", eta_s=None,
                 exit_code=returncode, stop_forced=stop_forced)
    if not already:
        if state == "failed":
            append_event(folder.root, {"type": "error", "step": status.step,
                                       "message": reason})
        append_event(folder.root, {"type": "status", "state": state, "step": status.step,
                                   "reason": reason})
    return state

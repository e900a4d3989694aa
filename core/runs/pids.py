"""Process discovery through /proc (Linux), for stopping and reattaching to runs.

Why not just `os.killpg`: accelerate's launcher can exit before its workers (orphaning
them, so they are no longer its children), and torchrun starts each worker in a new
session (so they are not in our process group). A run's processes are therefore found
four ways and united: the launcher's process group, its session, the descendants of
any process found (by ppid), and every process whose environment carries the run's
token (`RUN_TOKEN_ENV`, set when the run starts and inherited by all descendants).

A pid is identified together with its start time (field 22 of /proc/<pid>/stat, in
clock ticks since boot) so that a recycled pid is never mistaken for, or signalled as,
one of ours. Zombies count as gone: they hold no memory or GPU and only await reaping.
"""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

RUN_TOKEN_ENV = "DIFFTRAINER_RUN_TOKEN"
# When the run manager started the launcher (seconds since the epoch): the trainer's
# start-up breakdown counts the launcher's share from it (core/train/startup_clock.py).
LAUNCHED_AT_ENV = "DIFFTRAINER_LAUNCHED_AT"
PROC = Path("/proc")


@dataclass(frozen=True)
class ProcStat:
    pid: int
    ppid: int
    pgid: int
    sid: int
    state: str
    start_ticks: int


def proc_stat(pid: int) -> ProcStat | None:
    """Parsed /proc/<pid>/stat, or None when the process does not exist."""
    try:
        raw = (PROC / str(pid) / "stat").read_bytes().decode("utf-8", "replace")
    except OSError:
        return None
    # The command name (field 2) is in parentheses and may contain spaces or ')'.
    rest = raw[raw.rfind(")") + 2:].split()
    try:
        return ProcStat(pid, int(rest[1]), int(rest[2]), int(rest[3]), rest[0], int(rest[19]))
    except (IndexError, ValueError):
        return None


def start_ticks(pid: int) -> int | None:
    st = proc_stat(pid)
    return st.start_ticks if st else None


def is_running(pid: int | None, ticks: int | None = None) -> bool:
    """True when `pid` exists, is not a zombie and (if given) started at `ticks`."""
    if not pid or pid <= 0:
        return False
    st = proc_stat(pid)
    if st is None or st.state in ("Z", "X", "x"):
        return False
    return ticks is None or st.start_ticks == ticks


def all_processes() -> dict[int, ProcStat]:
    out: dict[int, ProcStat] = {}
    for entry in PROC.iterdir():
        if entry.name.isdigit():
            st = proc_stat(int(entry.name))
            if st is not None and st.state not in ("Z", "X", "x"):
                out[st.pid] = st
    return out


def has_token(pid: int, token: str) -> bool:
    """Whether the process's environment holds RUN_TOKEN_ENV=token (same-user only)."""
    try:
        env = (PROC / str(pid) / "environ").read_bytes()
    except OSError:
        return False
    return f"{RUN_TOKEN_ENV}={token}".encode() in env.split(b"\0")


def collect_run_processes(
    leader_pid: int | None, leader_ticks: int | None, token: str | None
) -> dict[int, int]:
    """Every live process of a run, as {pid: start_ticks}; never this process or its parents.

    The leader's group and session count only while the leader is the same process
    (a pgid/sid number outlives its leader and could be reused).
    """
    procs = all_processes()
    mine = {os.getpid()}
    parent = os.getppid()
    while parent > 1 and parent not in mine:  # our ancestors are never signalled
        mine.add(parent)
        st = procs.get(parent)
        parent = st.ppid if st else 0
    found: set[int] = set()
    leader_ok = leader_pid is not None and is_running(leader_pid, leader_ticks)
    if leader_ok:
        found.add(leader_pid)  # type: ignore[arg-type]
        found |= {p for p, st in procs.items() if leader_pid in (st.pgid, st.sid)}
    if token:
        found |= {p for p in procs if p not in mine and has_token(p, token)}
    children: dict[int, list[int]] = {}
    for p, st in procs.items():
        children.setdefault(st.ppid, []).append(p)
    stack = list(found)
    while stack:  # descendants, e.g. workers that cleared their environment
        for child in children.get(stack.pop(), []):
            if child not in found:
                found.add(child)
                stack.append(child)
    return {p: procs[p].start_ticks for p in found - mine if p in procs}


def alive_of(pids: dict[int, int]) -> dict[int, int]:
    return {p: t for p, t in pids.items() if is_running(p, t)}


def signal_processes(pids: dict[int, int], sig: int) -> list[int]:
    """Send `sig` to each pid that is still the same process; returns those signalled."""
    sent = []
    for pid, ticks in pids.items():
        if is_running(pid, ticks):
            try:
                os.kill(pid, sig)
                sent.append(pid)
            except (ProcessLookupError, PermissionError):
                pass
    return sent


def wait_gone(pids: dict[int, int], timeout_s: float, poll_s: float = 0.05) -> dict[int, int]:
    """Wait until none of `pids` runs or the timeout passes; returns the survivors."""
    deadline = time.monotonic() + timeout_s
    alive = alive_of(pids)
    while alive and time.monotonic() < deadline:
        time.sleep(poll_s)
        alive = alive_of(alive)
    return alive


def signal_name(returncode: int) -> str:
    try:
        return signal.Signals(-returncode).name
    except ValueError:
        return f"signal {-returncode}"

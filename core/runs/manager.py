"""Start, follow and stop a training run: the child process group and the run folder.

The child (`accelerate launch ...`) runs in its own session and process group, with
stdout and stderr appended to the folder's log (`train.log`; `cache.log` for a cache
job). Every launched process carries a run token in its environment, so
`core.runs.pids` finds all of them at stop time even after accelerate's launcher has
exited and orphaned them.

Stopping:
- A SIGINT to the whole group makes accelerate 1.15's launcher die of KeyboardInterrupt
  at once (measured: exit -2 within 0.7 s), orphaning the trainer in the middle of its
  save; torchrun's agent (multi-process) answers SIGINT by SIGTERM-ing its workers
  (torch.distributed.elastic), and it starts each worker in a new session. So the soft
  stop is: write the STOP file, SIGINT the launcher's children (the trainer ranks) and
  let the launcher collect their exit. DataLoader workers (grandchildren) are not
  interrupted mid-batch.
- After the grace period every process of the run still alive, collected before the
  first signal and re-collected since, gets SIGTERM, then SIGKILL.

The final state is decided from the exit code and what the trainer wrote, never
assumed: see core/runs/final_state.py.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from core.runs import pids
from core.runs.command import Join, LaunchSpec, format_command
from core.runs.final_state import finalize_run
from core.runs.folder import RunFolder, as_folder
from core.runs.registry import (
    new_record,
    reconcile_run,
    register_run,
    run_info,
    run_is_alive,
)
from core.runs.status import RunStatus, append_event, read_status, write_status

DEFAULT_GRACE_S = 60.0  # time to finish the step and save a checkpoint after SIGINT
TERM_GRACE_S = 5.0  # between SIGTERM and SIGKILL
STRAGGLER_LINGER_S = 10.0  # leftovers after the launcher ended are killed after this
_STALE_FIELDS = ("exit_code", "reason", "finalized_by", "eta_s", "stop_forced")


class RunStartError(RuntimeError):
    """The child could not be started (or the folder holds a live run)."""


def request_stop(run_dir: str | Path) -> None:
    """The soft stop: the trainer checks for this file every step, saves and exits."""
    path = RunFolder(Path(run_dir)).stop_file
    path.write_text(f"stop requested at {time.strftime('%Y-%m-%d %H:%M:%S')}\n")


# ---------------------------------------------------------------- the handle


@dataclass
class StopResult:
    state: str
    forced: bool  # SIGTERM/SIGKILL were needed
    pids: list[int] = field(default_factory=list)  # every process collected for the run
    killed: list[int] = field(default_factory=list)  # those that needed SIGKILL


@dataclass
class RunHandle:
    """A started (or reattached) run. `popen` is None after a reattach."""

    folder: RunFolder
    pid: int
    start_ticks: int | None
    token: str
    popen: subprocess.Popen[bytes] | None = None
    log_offset: int = 0  # where this run's part of the log begins (for LogTail)
    linger_s: float = STRAGGLER_LINGER_S
    term_grace_s: float = TERM_GRACE_S
    final_state: str | None = None
    join: Join | None = None  # a multi-machine launch (unknown after a reattach)
    started_mono: float = field(default_factory=time.monotonic)
    _leader_ended_at: float | None = None

    @property
    def run_dir(self) -> Path:
        return self.folder.root

    @property
    def returncode(self) -> int | None:
        return self.popen.poll() if self.popen is not None else None

    def leader_running(self) -> bool:
        if self.popen is not None:
            return self.popen.poll() is None
        return pids.is_running(self.pid, self.start_ticks)

    def processes(self) -> dict[int, int]:
        return pids.collect_run_processes(self.pid, self.start_ticks, self.token)

    def poll(self) -> str | None:
        """The final state once every process of the run has ended, else None.

        Processes left after the launcher ended are given `linger_s` (the trainer
        may still be saving) unless the trainer already wrote a final state,
        then terminated: a leaked worker must not hold the GPU forever.
        """
        if self.final_state is not None:
            return self.final_state
        if self.leader_running():
            return None
        now = time.monotonic()
        self._leader_ended_at = self._leader_ended_at or now
        left = self.processes()
        if left:
            status = read_status(self.run_dir) or RunStatus()
            trainer_pid = status.pid if status.pid != self.pid else None
            saving = trainer_pid in left and not status.final
            if saving or now - self._leader_ended_at < self.linger_s:
                return None
            _terminate(left, self.term_grace_s)
        stop = self.folder.stop_file.exists()
        failure = "" if stop else self._join_failure()
        self.final_state = finalize_run(self.folder, self.returncode, stop_requested=stop,
                                        failure=failure)
        return self.final_state

    def _join_failure(self) -> str:
        """The reason when a multi-machine launcher gave up waiting for the others: it
        failed after the join timeout and the trainer never started (it would have
        written its own pid into status.json). Also said in the log, which the CLI
        echoes."""
        if self.join is None or self.returncode == 0:
            return ""
        status = read_status(self.run_dir) or RunStatus()
        waited = time.monotonic() - self.started_mono
        if status.pid not in (None, self.pid) or waited < self.join.timeout_s:
            return ""
        with open(self.folder.log, "a", encoding="utf-8") as log:
            log.write(f"error: {self.join.failure}\n")
        return self.join.failure

    def wait(self, timeout: float | None = None, poll_s: float = 0.2) -> str | None:
        """Block until the run ends (or `timeout` passes); the final state or None."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while (state := self.poll()) is None:
            if deadline is not None and time.monotonic() >= deadline:
                return None
            if self.popen is not None and self.popen.poll() is None:
                try:
                    self.popen.wait(timeout=poll_s)
                except subprocess.TimeoutExpired:
                    pass
            else:
                time.sleep(poll_s)
        return state

    def stop(self, grace_s: float = DEFAULT_GRACE_S) -> StopResult:
        return stop_run(self.folder, grace_s=grace_s, handle=self)


def attach(where: RunFolder | str | Path) -> RunHandle | None:
    """A handle on a live run started by another process (a restarted UI); else None."""
    folder = as_folder(where)
    status = read_status(folder.root)
    if status is None or status.launcher_pid is None or not run_is_alive(status):
        return None
    return RunHandle(folder=folder, pid=status.launcher_pid,
                     start_ticks=status.launcher_start, token=status.run_token)


# ---------------------------------------------------------------- start


def _open_log(folder: RunFolder, command: str, notes: tuple[str, ...] = ()
              ) -> tuple[int, int]:
    """The log opened for appending, after a header line and `notes`; (fd, offset of the
    header)."""
    fd = os.open(folder.log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    offset = os.fstat(fd).st_size
    stamp = time.strftime("%Y-%m-%d %H:%M:%S")
    lines = [f"=== run started {stamp}", f"$ {command}", *notes]
    os.write(fd, "".join(f"{line}\n" for line in lines).encode())
    return fd, offset


def _reset_status(folder: RunFolder, **fields: Any) -> None:
    """`fields` (the new launch's state and launcher), keeping step/max_steps of a resumed
    run, dropping old results."""
    old = (read_status(folder.root) or RunStatus()).to_dict()
    kept = {k: v for k, v in old.items() if k not in _STALE_FIELDS}
    write_status(folder.root, replace=True, **{**kept, **fields})


def start_run(spec: LaunchSpec, where: RunFolder | str | Path) -> RunHandle:
    """Start the child in its own session, logging to the folder's log; record it.

    Writes command.txt, status.json (state "starting", the launcher's pid, start time
    and token) and, when `spec.workspace` is set, the registry record. Call
    `prepare_run_dir` first; this only refuses a folder whose run is still alive.
    """
    folder = as_folder(where)
    run_dir = folder.root
    run_dir.mkdir(parents=True, exist_ok=True)
    if run_is_alive(read_status(run_dir)):
        raise RunStartError(f"{run_dir}: a run is still going in this folder; stop it "
                            f"first or choose another output.dir")
    folder.stop_file.unlink(missing_ok=True)
    command = format_command(spec)
    folder.command.write_text(command + "\n", encoding="utf-8")
    token = uuid.uuid4().hex
    env = {**os.environ, **spec.env, "PYTHONUNBUFFERED": "1", pids.RUN_TOKEN_ENV: token,
           pids.LAUNCHED_AT_ENV: repr(time.time())}
    started = time.monotonic()
    log_fd, log_offset = _open_log(folder, command, spec.notes)
    try:
        popen = subprocess.Popen(
            spec.argv, cwd=spec.cwd, env=env, stdin=subprocess.DEVNULL, stdout=log_fd,
            stderr=subprocess.STDOUT, start_new_session=True, close_fds=True,
        )
    except OSError as exc:
        reason = f"could not start {spec.argv[0]!r}: {exc}"
        os.write(log_fd, f"{reason}\n".encode())
        _reset_status(folder, state="failed", reason=reason, finalized_by="manager")
        append_event(run_dir, {"type": "error", "message": reason})
        raise RunStartError(reason) from None
    finally:
        os.close(log_fd)  # the child holds its own copy
    ticks = pids.start_ticks(popen.pid)
    # "starting" and the new launcher in one write: a reader in between would find a live
    # state with no live process (the last launch's, or none) and call the run failed.
    # The trainer's first status write comes seconds later (after its imports), so this
    # read-modify-write does not race it in practice.
    _reset_status(folder, state="starting", pid=popen.pid, launcher_pid=popen.pid,
                  launcher_start=ticks, run_token=token, started_at=round(time.time(), 3))
    if spec.workspace is not None:
        register_run(spec.workspace, new_record(run_dir, popen.pid, ticks, token, command))
    return RunHandle(folder=folder, pid=popen.pid, start_ticks=ticks, token=token,
                     popen=popen, log_offset=log_offset, join=spec.join,
                     started_mono=started)


# ---------------------------------------------------------------- stop


def _interrupt_targets(found: dict[int, int], leader: int) -> dict[int, int]:
    """The trainer ranks: the launcher's children, plus orphans whose parent is gone.

    If the launcher has no such process (it is the trainer itself), the launcher.
    """
    stats = {p: pids.proc_stat(p) for p in found}
    targets = {
        p: t for p, t in found.items()
        if p != leader and (st := stats[p]) is not None
        and (st.ppid == leader or st.ppid not in found)
    }
    return targets or {p: t for p, t in found.items() if p == leader}


def _terminate(alive: dict[int, int], term_grace_s: float) -> list[int]:
    """SIGTERM, wait, SIGKILL whatever is left; returns the pids that needed SIGKILL."""
    pids.signal_processes(alive, signal.SIGTERM)
    left = pids.wait_gone(alive, term_grace_s)
    if left:
        pids.signal_processes(left, signal.SIGKILL)
        pids.wait_gone(left, 5.0)
    return sorted(left)


def _wait_all(handle: RunHandle, found: dict[int, int], timeout_s: float) -> dict[int, int]:
    """Wait for every process of the run, adding any the run starts meanwhile."""
    deadline = time.monotonic() + timeout_s
    next_scan = 0.0
    while True:
        if handle.popen is not None:
            handle.popen.poll()  # reap the launcher so it does not linger as a zombie
        if time.monotonic() >= next_scan:
            found.update(handle.processes())
            next_scan = time.monotonic() + 0.5
        alive = pids.alive_of(found)
        if not alive or time.monotonic() >= deadline:
            return alive
        time.sleep(0.05)


def stop_run(
    where: RunFolder | str | Path,
    grace_s: float = DEFAULT_GRACE_S,
    *,
    term_grace_s: float = TERM_GRACE_S,
    handle: RunHandle | None = None,
) -> StopResult:
    """Stop a run: STOP file and SIGINT, `grace_s` to save, then SIGTERM and SIGKILL.

    Every pid of the run is collected before the first signal. Returns the final state
    as decided by `finalize_run`; a run that is not alive is only finalized.
    """
    folder = handle.folder if handle is not None else as_folder(where)
    run_dir = folder.root
    handle = handle or attach(folder)
    if handle is None:  # nothing runs; a run that died unnoticed is recorded as failed
        if read_status(run_dir) is None:
            raise FileNotFoundError(f"{run_dir}: no run here (no status.json)")
        return StopResult(state=reconcile_run(run_info(run_dir)).state, forced=False)
    found = handle.processes()
    if not found and (state := handle.poll()) is not None:  # it had ended already
        return StopResult(state=state, forced=False)
    request_stop(run_dir)
    pids.signal_processes(_interrupt_targets(found, handle.pid), signal.SIGINT)
    alive = _wait_all(handle, found, grace_s)
    killed: list[int] = []
    if alive:
        killed = _terminate(alive, term_grace_s)
    if handle.popen is not None:
        try:
            handle.popen.wait(timeout=5.0)
        except subprocess.TimeoutExpired:
            pass
    state = finalize_run(folder, handle.returncode, stop_requested=True, forced=bool(alive))
    handle.final_state = state
    return StopResult(state=state, forced=bool(alive), pids=sorted(found), killed=killed)

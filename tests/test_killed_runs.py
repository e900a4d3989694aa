"""A trainer killed by a signal (SIGKILL from the out-of-memory killer above all) fails
the run saying so: status.json, the headless follow (core/runs/final_state.py,
core/runs/accelerate_launch.py). The real trainer under `app.py --no-ui` is killed in
tests/test_train.py."""

from __future__ import annotations

import io
import os
import signal
import threading
from pathlib import Path

import pytest
from test_runs import (
    direct_spec,
    events_of,
    ranks_under_the_launcher,
    reaper,  # noqa: F401 (a fixture)
    wait_for,
)

from core.ops import follow_in_terminal
from core.runs import pids, read_status, start_run

KILL_ADVICE = ("killed by signal 9 (often the out-of-memory killer: this machine's RAM ran "
               "out; the check's host memory line says what the run holds: pin fewer blocks "
               "(a smaller model.blocks_to_swap), run fewer processes, or add RAM or swap "
               "space)")


def kill_at_step(run_dir: Path, step: int, pid_of) -> threading.Thread:
    """A thread that SIGKILLs `pid_of()` once status.json says `step` (as the
    out-of-memory killer would: no warning, no handler runs)."""
    def kill() -> None:
        wait_for(lambda: (getattr(read_status(run_dir), "step", 0) or 0) >= step, 60,
                 f"step {step}")
        os.kill(pid_of(), signal.SIGKILL)
    thread = threading.Thread(target=kill, daemon=True)
    thread.start()
    return thread


def assert_killed_reason(run_dir: Path, reason: str) -> None:
    """The reason names the signal, what it often is, the last step and the memory."""
    last = [e["step"] for e in events_of(run_dir) if e["type"] == "step"][-1]
    assert KILL_ADVICE in reason, reason
    assert f"at step {last}/100000" in reason, reason
    assert "memory: peak 300 MiB host RSS" in reason, reason  # the fake's memory event


def test_a_killed_trainer_fails_saying_so_in_status_and_in_the_follow(tmp_path):
    """The trainer run directly (its own exit status: -9): status.json and the headless
    follow (its closing error line) say it was killed, at which step, with which memory."""
    run_dir = tmp_path / "run"
    handle = start_run(direct_spec(run_dir, tmp_path, "--steps", "100000"), run_dir)
    killer = kill_at_step(run_dir, 3, lambda: handle.pid)
    out = io.StringIO()
    state, code = follow_in_terminal(handle, out, grace_s=5.0)
    killer.join()
    assert (state, code) == ("failed", 1) and handle.returncode == -signal.SIGKILL
    status = read_status(run_dir)
    assert status.state == "failed" and status.exit_code == -signal.SIGKILL
    assert_killed_reason(run_dir, status.reason)
    assert out.getvalue().splitlines()[-1] == f"error: {status.reason}"
    [error] = [e for e in events_of(run_dir) if e["type"] == "error"]
    assert error["message"] == status.reason


@pytest.mark.slow
@pytest.mark.parametrize("processes", [1, 2])
def test_a_trainer_killed_under_the_launcher_fails_saying_so(tmp_path, reaper,  # noqa: F811
                                                           processes):
    """Through accelerate's launcher as the run manager starts it: the trainer (the
    launcher's child, not the launcher) gets SIGKILL. accelerate alone exits 1 (one
    process, --quiet) or raises torchrun's ChildFailedError after SIGTERM-ing the other
    rank, which then writes "stopped"; core/runs/accelerate_launch.py exits 137 and says
    which process, and the run fails saying it was killed."""
    handle, run_dir, pid_file = ranks_under_the_launcher(tmp_path, reaper, processes)
    victim = int(pid_file.read_text().split()[1])
    assert pids.proc_stat(victim).ppid == handle.pid  # the launcher's child
    kill_at_step(run_dir, 3, lambda: victim).join()
    assert handle.wait(timeout=60) == "failed"
    status = read_status(run_dir)
    assert status.exit_code == 128 + signal.SIGKILL
    assert_killed_reason(run_dir, status.reason)
    assert f"launcher: the process (pid {victim}) was killed by signal 9 (SIGKILL)" in \
        (run_dir / "train.log").read_text()

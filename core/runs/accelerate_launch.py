"""`accelerate launch` as the run manager starts it: accelerate's own launcher
(`accelerate.commands.launch`, same arguments, same behaviour), imported outside the
garbage collector's collections and ended through `core.exits.exit_with`.

Why: the launcher imports torch (through accelerate) only to start the trainer or the
cache builder and wait for it. The collections during that import, and the ones at its
exit, walked every object torch made: 0.8 s of the 2.3 s of CPU a launch of one process
spent in its launcher on the 2-core test machine, part of it after the trainer had said
it was done, while a person waits for the run to show as ended. `python -m
accelerate.commands.launch` with the same arguments does the same work, only slower.

One difference: a child killed by a signal (SIGKILL from the out-of-memory killer above
all) ends the launcher with 128 + the signal's number and a line saying so, where
accelerate's launcher exits 1 (one process, `--quiet`) or with torchrun's traceback
(several), and the run manager could not tell the kill from a crash
(core/runs/final_state.py reads it).
"""

from __future__ import annotations

import signal
import subprocess
import sys
import traceback
from typing import Any, NoReturn

from core.exits import EXIT_FAILED, EXIT_OK, SIGNAL_EXIT_BASE, exit_with
from core.libraries import loaded_outside_collections


def killed_line(pid: int | None, signum: int) -> str:
    """The log line the launcher writes when a child died of `signum`."""
    try:
        name = signal.Signals(signum).name
    except ValueError:
        name = f"signal {signum}"
    who = f"the process (pid {pid})" if pid else "a process"
    return f"launcher: {who} was killed by signal {signum} ({name})"


def _end_killed(pid: int | None, signum: int) -> NoReturn:
    print(killed_line(pid, signum), file=sys.stderr, flush=True)
    exit_with(SIGNAL_EXIT_BASE + signum)


def simple_launcher(args: Any) -> None:
    """accelerate's `simple_launcher` (one process), but a child killed by a signal ends
    the launcher with 128 + its number; any other failure exits 1, as `--quiet` does."""
    from accelerate.commands.launch import prepare_simple_launcher_cmd_env

    cmd, env = prepare_simple_launcher_cmd_env(args)
    process = subprocess.Popen(cmd, env=env)
    process.wait()
    if process.returncode < 0:
        _end_killed(process.pid, -process.returncode)
    if process.returncode != 0:
        if not args.quiet:
            raise subprocess.CalledProcessError(returncode=process.returncode, cmd=cmd)
        exit_with(EXIT_FAILED)


def killed_rank(exc: BaseException) -> tuple[int | None, int] | None:
    """(pid, signal) of the first failed rank of torchrun's ChildFailedError when a
    signal killed it; None for anything else."""
    first = getattr(exc, "get_first_failure", None)
    if first is None:
        return None
    _, failure = first()
    code = getattr(failure, "exitcode", 0)
    return (getattr(failure, "pid", None), -code) if isinstance(code, int) and code < 0 \
        else None


def main() -> NoReturn:
    with loaded_outside_collections():
        from accelerate.commands import launch
    launch.simple_launcher = simple_launcher  # launch_command looks it up at call time
    try:
        launch.main()
    except SystemExit as stop:  # 1 when the child failed (--quiet), or a usage error
        exit_with(stop.code)
    except Exception as exc:  # several processes: torchrun's ChildFailedError
        killed = killed_rank(exc)
        if killed is None:
            raise
        traceback.print_exc()
        _end_killed(*killed)
    exit_with(EXIT_OK)


if __name__ == "__main__":
    main()

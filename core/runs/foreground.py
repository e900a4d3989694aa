"""Follow a run in the foreground (the headless CLI): show its log, stop it on Ctrl-C.

What is shown is the console's business (`core/runs/console.py`): the CLI passes one
that folds the trainer's step lines into a progress line; a plain callable gets every
line as it is.

The child runs in its own session, so a Ctrl-C in the terminal (or a scheduler's
SIGTERM) reaches only this process; it is turned into a graceful stop of the run
(SIGINT to the trainer, which saves). A second Ctrl-C during the stop forces it.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable
from types import FrameType

from core.runs.console import Console, EchoConsole
from core.runs.manager import DEFAULT_GRACE_S, RunHandle
from core.runs.tail import LogTail


def _raise_interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def follow_run(
    handle: RunHandle,
    echo: Callable[[str], None] | Console = print,
    *,
    grace_s: float = DEFAULT_GRACE_S,
    poll_s: float = 0.5,
    stopping: bool = False,
) -> str:
    """Show the run's log lines until it ends; returns its final state. `stopping`: a
    Ctrl-C came while the run started, so it is stopped as one while following would.

    Map the state to the CLI exit code with `core.runs.status.exit_code_for_state`.
    """
    console = echo if isinstance(echo, Console) else EchoConsole(echo)
    tail = LogTail(handle.folder.log, offset=handle.log_offset)
    in_main = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _raise_interrupt) if in_main else None
    try:
        try:
            if stopping:
                raise KeyboardInterrupt
            while (state := handle.poll()) is None:
                for line in tail.read():
                    console.line(line)
                console.refresh(tail.partial)
                time.sleep(poll_s)
        except KeyboardInterrupt:
            console.line(f"stopping: the trainer saves a checkpoint (up to {grace_s:.0f} s); "
                         "press Ctrl-C again to force")
            try:
                state = handle.stop(grace_s).state
            except KeyboardInterrupt:
                console.line("forcing the stop")
                state = handle.stop(0.0).state
    finally:
        if in_main:
            signal.signal(signal.SIGTERM, previous if previous is not None else signal.SIG_DFL)
    for line in tail.read():
        console.line(line)
    if tail.partial.strip():
        console.line(tail.partial)
    console.close()
    return state

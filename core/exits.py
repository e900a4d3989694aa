"""Exit codes of the CLI contract, shared by the headless CLI and the launched programs."""

import sys
from typing import NoReturn

EXIT_OK = 0  # done
EXIT_FAILED = 1  # a run failed
EXIT_INVALID = 2  # the config or datasets are invalid
EXIT_STOPPED = 130  # stopped by the user
# A launcher whose child died of signal N exits SIGNAL_EXIT_BASE + N, as a shell reports
# it (core/runs/accelerate_launch.py; core/runs/final_state.py reads it back).
SIGNAL_EXIT_BASE = 128


def stop_signals_interrupt() -> None:
    """SIGINT and SIGTERM raise KeyboardInterrupt in this process, whatever it inherited.

    Why: Python turns SIGINT into KeyboardInterrupt only when its parent had not ignored
    it, and a shell ignores SIGINT in what it starts in the background (`app.py &`): the
    cache build or captioning started from such an app then ignored the Stop button's
    SIGINT, ran on through the grace period and finished or was killed. The programs
    catch KeyboardInterrupt, keep what they wrote (each entry or caption is written whole)
    and exit EXIT_STOPPED. The trainer installs handlers of its own (a clean step end)."""
    import signal

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt(signal.Signals(signum).name)

    signal.signal(signal.SIGINT, interrupt)
    signal.signal(signal.SIGTERM, interrupt)


def exit_with(code: int | str | None) -> NoReturn:
    """End this program with `code` (whatever sys.exit takes), as sys.exit does, without
    the interpreter's last collections walking every object the libraries made.

    Why: at exit Python clears each module and collects garbage as it goes, and with
    torch, diffusers and peft loaded each collection walks millions of objects: the
    trainer took 1.4 to 1.6 s (of CPU, after it had written "done") to end, its
    launcher waiting on it; 0.2 s with them frozen. Frozen objects are still finalized
    and every exit handler still runs (files, trackers, process groups close as before);
    only the collector skips them."""
    import gc

    gc.freeze()
    sys.exit(code)

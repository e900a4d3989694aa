"""Exit codes of the CLI contract, shared by the headless CLI and the launched programs."""

EXIT_OK = 0  # done
EXIT_FAILED = 1  # a run failed
EXIT_INVALID = 2  # the config or datasets are invalid
EXIT_STOPPED = 130  # stopped by the user


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

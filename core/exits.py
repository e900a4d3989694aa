"""Exit codes of the CLI contract, shared by the headless CLI and the launched programs."""

EXIT_OK = 0  # done
EXIT_FAILED = 1  # a run failed
EXIT_INVALID = 2  # the config or datasets are invalid
EXIT_STOPPED = 130  # stopped by the user

"""`accelerate launch` as the run manager starts it: accelerate's own launcher
(`accelerate.commands.launch`, same arguments, same behaviour), imported outside the
garbage collector's collections and ended through `core.exits.exit_with`.

Why: the launcher imports torch (through accelerate) only to start the trainer or the
cache builder and wait for it. The collections during that import, and the ones at its
exit, walked every object torch made: 0.8 s of the 2.3 s of CPU a launch of one process
spent in its launcher on the 2-core test machine, part of it after the trainer had said
it was done, while a person waits for the run to show as ended. `python -m
accelerate.commands.launch` with the same arguments does the same work, only slower.
"""

from __future__ import annotations

from typing import NoReturn

from core.exits import EXIT_OK, exit_with
from core.libraries import loaded_outside_collections


def main() -> NoReturn:
    with loaded_outside_collections():
        from accelerate.commands.launch import main as accelerate_launch
    try:
        accelerate_launch()
    except SystemExit as stop:  # 1 when the child failed (--quiet), or a usage error
        exit_with(stop.code)
    exit_with(EXIT_OK)


if __name__ == "__main__":
    main()

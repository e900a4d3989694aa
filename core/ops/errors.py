"""The one exception every action raises when it refuses or cannot start."""

from __future__ import annotations

from core.exits import EXIT_INVALID
from core.problems import Hint, Problem


class OpError(Exception):
    """An action was refused or could not start; nothing was left half done. `message`
    is the CLI's wording; a `hint` (when the refusal names a way out) is the same as
    data, for the UI to word with its own controls."""

    def __init__(self, message: str, problems: list[Problem] | None = None,
                 exit_code: int = EXIT_INVALID, hint: Hint | None = None):
        self.message = message
        self.problems = problems or []
        self.exit_code = exit_code
        self.hint = hint
        super().__init__(message + "".join(f"\n{p}" for p in self.problems))

"""One shape for every problem a check can find, so CLI and UI print them the same way."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

Level = Literal["error", "warning"]


@dataclass(frozen=True)
class Problem:
    level: Level
    where: str  # a config key ("datasets.0.vae_cache") or a file path
    message: str

    def __str__(self) -> str:
        return f"{self.level}: {self.where}: {self.message}"


def error(where: str, message: str) -> Problem:
    return Problem("error", where, message)


def warning(where: str, message: str) -> Problem:
    return Problem("warning", where, message)


def counted(n: int, noun: str) -> str:
    """"1 error", "2 errors": a count read as a sentence, not "1 error(s)"."""
    return f"{n} {noun}{'' if n == 1 else 's'}"


def blocking(n_errors: int, what: str) -> str:
    """"1 error blocks launch", "3 errors block launch"."""
    return f"{counted(n_errors, 'error')} {'blocks' if n_errors == 1 else 'block'} {what}"


def errors(problems: Iterable[Problem]) -> list[Problem]:
    return [p for p in problems if p.level == "error"]


def warnings(problems: Iterable[Problem]) -> list[Problem]:
    return [p for p in problems if p.level == "warning"]


def errors_first(problems: Iterable[Problem]) -> list[Problem]:
    """Errors, then warnings, each group in the order found."""
    items = list(problems)
    return errors(items) + warnings(items)


class ConfigError(Exception):
    """Raised when a config cannot be loaded or an override cannot be applied.

    Carries every problem found so the caller can print them one per line.
    """

    def __init__(self, problems: list[Problem]):
        self.problems = problems
        super().__init__("\n".join(str(p) for p in problems))

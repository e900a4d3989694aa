"""One shape for every problem a check can find, so CLI and UI print them the same way."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Literal

Level = Literal["error", "warning"]


@dataclass(frozen=True)
class Hint:
    """A refusal whose way out names a front end's controls, kept as data so each front
    end words it with its own (the CLI with --set and its flags, the UI with the form's
    labels and buttons) instead of one rewriting the other's text.

    `text` is the whole refusal with slots: {key} the config key `key` as the front end
    names it; {set} that key set to the suggested `value`; {resume} continuing the run in
    place; {extend} training a done run on to a larger `value` of `key`; {listed} where
    the problems behind it are shown (the CLI prints them below, so it says nothing)."""

    text: str
    key: str = ""
    value: str = ""

    def say(self, words: Mapping[str, str]) -> str:
        out = self.text
        for slot, said in words.items():
            out = out.replace("{" + slot + "}", said)
        return out

    def cli(self) -> str:
        """The refusal as the CLI says it (and every Problem's `message`)."""
        return self.say({"key": self.key, "set": f"--set {self.key}={self.value}",
                         "resume": "--resume", "listed": "",
                         "extend": f"Extend it: give a larger {self.key} "
                                   f"(--set {self.key}={self.value})"})

    def after(self, lead: str) -> Hint:
        """The same refusal behind `lead` ("cannot launch: ")."""
        return Hint(lead + self.text, self.key, self.value)


@dataclass(frozen=True)
class Problem:
    level: Level
    where: str  # a config key ("datasets.0.vae_cache") or a file path
    message: str  # as the CLI says it; with a hint, its `cli()`
    hint: Hint | None = None  # the message as data, for the UI to word (ui/actions.py)

    def __str__(self) -> str:
        return f"{self.level}: {self.where}: {self.message}"


def error(where: str, message: str) -> Problem:
    return Problem("error", where, message)


def hinted(where: str, hint: Hint) -> Problem:
    """An error whose way out each front end words itself (Hint)."""
    return Problem("error", where, hint.cli(), hint)


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


def samples_said(images: int, clips: int, clip_noun: str = "clip(s)") -> str:
    """A count of images and clips as a line says it: a clip dataset's clips alone (no
    "0 image(s)"), an image dataset's images alone, a mixed one both."""
    parts = [f"{images} image(s)"] if images or not clips else []
    return ", ".join(parts + ([f"{clips} {clip_noun}"] if clips else []))

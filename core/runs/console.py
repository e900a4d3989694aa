"""What the headless CLI prints while it follows a run's log.

The trainer logs one line per optimizer step (the UI reads them); a terminal should not
scroll 400 lines for 400 steps. `make_console` picks the display for the CLI's stdout:

- a terminal: `LiveConsole` redraws one progress line in place (carriage return, clear
  to the end of the line); every other line prints above it, and a progress bar the
  child is still drawing (a cache build's tqdm bar: the log's unfinished last line) takes
  its place while it runs;
- anything else (a file, a pipe, CI): `LogConsole` prints a progress line every
  `report_every(max_steps)` steps, the first and the last step, and every other line.

`EchoConsole` prints every line as it is: `follow_run` uses it for a plain callable.
"""

from __future__ import annotations

import os
import shutil
import sys
import time
from collections import deque
from collections.abc import Callable
from typing import TextIO

from core.runs.progress import (
    StepLine,
    format_progress,
    parse_step_line,
    report_every,
    strip_escapes,
)

CLEAR_LINE = "\r\x1b[K"  # back to the start of the row, erase to its end


class Console:
    """Receives the followed log: complete lines, the unfinished last one, the end."""

    def line(self, text: str) -> None:
        raise NotImplementedError

    def refresh(self, partial: str) -> None:
        """Once per poll, after the new lines; `partial` is the log's unfinished line."""

    def close(self) -> None:
        """The run ended: leave the output ready for the summary lines."""


class EchoConsole(Console):
    def __init__(self, echo: Callable[[str], None]) -> None:
        self.echo = echo

    def line(self, text: str) -> None:
        self.echo(text)


class StepTracker:
    """The latest step and a moving average of the loss, over the log interval's steps."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.started = clock()
        self.last: StepLine | None = None
        self.first_step: int | None = None
        self._losses: deque[float] = deque()

    @property
    def every(self) -> int:
        return report_every(self.last.max_steps) if self.last else 1

    def add(self, step: StepLine) -> None:
        if self.first_step is None:
            self.first_step = step.step
        self.last = step
        if self._losses.maxlen != self.every:
            self._losses = deque(self._losses, maxlen=self.every)
        self._losses.append(step.loss)

    def loss_avg(self) -> float | None:
        if len(self._losses) < 2:  # the average of one loss is that loss: say it once
            return None
        return sum(self._losses) / len(self._losses)

    def text(self, width: int | None = None) -> str:
        s = self.last
        if s is None:
            return ""
        return format_progress(s.step, s.max_steps, s.loss, s.it_s, s.eta_s,
                               self.clock() - self.started, width, self.loss_avg())


class LogConsole(Console):
    """For a file or a pipe: a progress line every N steps instead of one per step."""

    def __init__(self, write: Callable[[str], None],
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.write = write
        self.steps = StepTracker(clock)
        self._printed: int | None = None  # the last step a progress line was printed for

    def line(self, text: str) -> None:
        text = strip_escapes(text)
        step = parse_step_line(text)
        if step is None:
            self.write(text)
            return
        self.steps.add(step)
        if (step.step == self.steps.first_step or step.step % self.steps.every == 0
                or step.step >= step.max_steps):
            self._print_step()

    def _print_step(self) -> None:
        self.write(self.steps.text())
        self._printed = self.steps.last.step if self.steps.last else None

    def close(self) -> None:
        """A run that stopped or failed between two progress lines: where it ended."""
        last = self.steps.last
        if last is not None and self._printed != last.step:
            self._print_step()


class LiveConsole(Console):
    """For a terminal: one progress line, redrawn in place; other lines print above it."""

    def __init__(self, stream: TextIO, columns: Callable[[], int] | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.stream = stream
        self.columns = columns or (lambda: shutil.get_terminal_size().columns)
        self.steps = StepTracker(clock)
        self._shown = False  # a progress line is on the screen, without a newline
        self._drawn = ""  # what it says: an unchanged line is not written again

    def _width(self) -> int:
        # One column short of the row: writing the last column wraps on some terminals,
        # and a carriage return then redraws only the wrapped part.
        return max(20, self.columns() - 1)

    def _clear(self) -> None:
        if self._shown:
            self.stream.write(CLEAR_LINE)
            self._shown = False

    def line(self, text: str) -> None:
        text = strip_escapes(text)
        step = parse_step_line(text)
        if step is not None:
            self.steps.add(step)  # drawn by the next refresh: once per poll, not per step
            return
        self._clear()
        self.stream.write(text + "\n")
        self.stream.flush()

    def refresh(self, partial: str) -> None:
        # A bar the child is still drawing (a cache build's) is what is happening now.
        live = strip_escapes(partial).strip()
        width = self._width()
        text = live[:width] if live else self.steps.text(width)
        if text and not (self._shown and text == self._drawn):
            self.stream.write(CLEAR_LINE + text)
            self._shown, self._drawn = True, text
            self.stream.flush()

    def close(self) -> None:
        if self.steps.last is not None:
            self.refresh("")  # the final figures (elapsed included), then end the line
        if self._shown:
            self.stream.write("\n")
            self._shown = False
        self.stream.flush()


def make_console(stream: TextIO | None = None) -> Console:
    """A `LiveConsole` when `stream` (stdout) is a terminal that understands the clear-line
    sequence, else a `LogConsole`."""
    stream = stream or sys.stdout
    if stream.isatty() and os.environ.get("TERM", "") != "dumb":
        return LiveConsole(stream)

    def write(text: str) -> None:
        print(text, file=stream, flush=True)

    return LogConsole(write)

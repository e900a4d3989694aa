"""Turn a run folder's tails into display-ready state, for a UI that polls.

A `RunFollower` reads only what was written since its last poll (train.log by byte
offset with `\\r` progress collapsed, events.jsonl by byte offset) and keeps what a view
needs: the last lines of the log, the loss and eval-loss series, and the progress
(state, step, it/s, ETA) from status.json and the step events. Version counters tell
the caller whether anything changed, so an unchanged view is not re-sent.

No gradio here: the follower is plain state, one per browser session.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from core.runs.folder import RunFolder
from core.runs.progress import parse_step_line, report_every
from core.runs.status import FINAL_STATES, read_status
from core.runs.tail import EventTail, LogTail

MAX_LINES = 400  # log lines kept for display
REOPEN_BYTES = 64 << 10  # reopening a run shows the end of its log, not all of it
MAX_POINTS = 2000  # series longer than this are thinned for the plot
TRAIN, EVAL, EVAL_SHUFFLED = "train", "eval", "eval (shuffled captions)"
SERIES = (TRAIN, EVAL, EVAL_SHUFFLED)  # every series the loss plot can show, in order


@dataclass
class Progress:
    state: str = "starting"
    step: int = 0
    max_steps: int | None = None
    it_s: float | None = None
    eta_s: float | None = None
    loss: float | None = None
    reason: str = ""

    @property
    def fraction(self) -> float:
        if not self.max_steps:
            return 0.0
        return max(0.0, min(1.0, self.step / self.max_steps))

    @property
    def final(self) -> bool:
        return self.state in FINAL_STATES


@dataclass
class RunFollower:
    run_dir: Path
    log_offset: int | None = None  # where this run's log part begins; None: reopen a run
    lines: deque[str] = field(default_factory=lambda: deque(maxlen=MAX_LINES))
    losses: list[tuple[int, float]] = field(default_factory=list)
    evals: list[tuple[int, str, float]] = field(default_factory=list)  # step, series, loss
    progress: Progress = field(default_factory=Progress)
    log_version: int = 0
    plot_version: int = 0
    status_version: int = 0
    partial: str = ""
    step_line: str = ""  # the newest step line, shown last until a newer line comes
    _status_stamp: Any = None

    def __post_init__(self) -> None:
        self.run_dir = Path(self.run_dir)
        folder = RunFolder(self.run_dir)
        if self.log_offset is None:
            self._log = LogTail(folder.log, from_end=REOPEN_BYTES)
        else:
            self._log = LogTail(folder.log, offset=self.log_offset)
        self._events = EventTail(folder.events)

    def poll(self) -> RunFollower:
        """Read whatever is new; bumps the version counters of what changed."""
        new = self._log.read()
        partial = self._log.partial
        if new or partial != self.partial:
            self._take_lines(new)
            self.partial = partial
            self.log_version += 1
        self._read_events()
        self._read_status()
        return self

    def _take_lines(self, new: list[str]) -> None:
        """Keep every line but most step lines: one a step would bury the rest (the
        progress bar and the plot show every step). A tenth of the run's step lines stay
        (`report_every`, as in a headless log), and the newest one until a newer line."""
        for line in new:
            step = parse_step_line(line)
            if step is None:
                self.step_line = ""
                self.lines.append(line)
            elif step.step % report_every(step.max_steps) == 0 or step.step >= step.max_steps:
                self.step_line = ""
                self.lines.append(line)
            else:
                self.step_line = line

    def _read_events(self) -> None:
        events = self._events.read()
        changed = False
        for event in events:
            kind = event.get("type")
            step = event.get("step")
            if kind == "step" and isinstance(event.get("loss"), (int, float)):
                self.losses.append((int(step or 0), float(event["loss"])))
                self._take_rate(event)
                changed = True
            elif kind == "eval":
                for name in ("loss", "loss_shuffled"):
                    if isinstance(event.get(name), (int, float)):
                        series = EVAL if name == "loss" else EVAL_SHUFFLED
                        self.evals.append((int(step or 0), series, float(event[name])))
                        changed = True
        if changed:
            self.plot_version += 1

    def _take_rate(self, event: dict[str, Any]) -> None:
        p = self.progress
        p.step = max(p.step, int(event.get("step") or 0))
        p.loss = float(event["loss"])
        p.it_s = event.get("it_s", p.it_s)
        p.eta_s = event.get("eta_s", p.eta_s)
        self.status_version += 1

    def _read_status(self) -> None:
        status = read_status(self.run_dir)
        if not status:
            return
        stamp = (status.updated_at, status.state, status.step)
        if stamp == self._status_stamp:
            return
        self._status_stamp = stamp
        p = self.progress
        p.state = status.state or p.state
        p.max_steps = status.max_steps or p.max_steps
        if isinstance(status.step, int):
            p.step = max(p.step, status.step)
        if p.final:
            p.eta_s = None
        elif status.eta_s is not None:
            p.eta_s = status.eta_s
        p.reason = status.reason
        self.status_version += 1

    def log_text(self) -> str:
        text = "\n".join([*self.lines, self.step_line] if self.step_line else self.lines)
        if self.partial.strip():
            text += ("\n" if text else "") + self.partial
        return text

    def plot_rows(self) -> list[tuple[int, float, str]]:
        """(step, loss, series) rows for a line plot, thinned to MAX_POINTS per series."""
        train = _thin(self.losses)
        rows = [(s, v, TRAIN) for s, v in train]
        rows += [(s, v, name) for s, name, v in self.evals]
        return rows


def _thin(points: list[tuple[int, float]]) -> list[tuple[int, float]]:
    if len(points) <= MAX_POINTS:
        return points
    stride = len(points) / MAX_POINTS
    return [points[int(i * stride)] for i in range(MAX_POINTS)] + [points[-1]]


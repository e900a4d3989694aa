"""The trainer's step line and the terminal's progress line: pure functions, no I/O.

The trainer prints one `step N/M ...` line per optimizer step into its log (the UI parses
them); the headless CLI turns those lines into a progress line (`core/runs/console.py`).
Both sides use this module, so the line the trainer writes and the parser cannot drift.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# Control sequences (ESC [ ... final byte), e.g. tqdm's cursor-up between nested bars:
# echoed above a redrawn progress line they would move the cursor and break the display.
_CSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]")
_STEP = re.compile(r"^step (\d+)/(\d+) loss (\S+) lr (\S+) (\S+) it/s eta (\S+)"
                   r"(?: routed \d+/\d+ tokens)?$")
BAR_MAX = 30  # bar cells at most; the numbers after it matter more than a long bar
BAR_MIN = 10  # below this the bar says nothing: leave it out


@dataclass(frozen=True)
class StepLine:
    """One optimizer step as the trainer reports it."""

    step: int
    max_steps: int
    loss: float
    lr: float
    it_s: float | None  # None: not measured yet (the first step)
    eta_s: float | None  # the trainer's estimate; the same figure status.json holds


def format_step_line(step: int, max_steps: int, loss: float, lr: float,
                     it_s: float | None, eta_s: float | None,
                     routed: tuple[int, int] | None = None) -> str:
    """The trainer's log line for one step (the format the UI tests and `parse_step_line`
    read); with train.token_routing, the step's (routed, seen) image tokens after it."""
    eta_text = "?" if eta_s is None else f"{eta_s:.0f}s"
    tail = "" if routed is None else f" routed {routed[0]}/{routed[1]} tokens"
    return (f"step {step}/{max_steps} loss {loss:.4f} lr {lr:.2e} "
            f"{it_s or 0:.2f} it/s eta {eta_text}{tail}")


def parse_step_line(line: str) -> StepLine | None:
    """The step a trainer step line reports, or None for any other line."""
    match = _STEP.match(line.strip())
    if match is None:
        return None
    step, max_steps, loss, lr, rate, eta = match.groups()
    try:
        it_s = float(rate) or None  # the trainer prints 0.00 before it has a rate
        eta_s = None if eta == "?" else float(eta.removesuffix("s"))
        return StepLine(int(step), int(max_steps), float(loss), float(lr), it_s, eta_s)
    except ValueError:
        return None


def is_step_line(line: str) -> bool:
    return parse_step_line(line) is not None


def report_every(max_steps: int) -> int:
    """How many steps apart a log (not a terminal) shows progress lines.

    A tenth of the run, rounded down to one significant digit: 10 to 20 lines show the
    loss curve's shape whatever the run's length, and the steps they name read as round
    numbers (400 steps: every 40; 1234: every 100; 8: every step).
    """
    tenth = max(1, max_steps // 10)
    scale = 10 ** (len(str(tenth)) - 1)
    return tenth // scale * scale


def strip_escapes(line: str) -> str:
    return _CSI.sub("", line)


def format_duration(seconds: float | None) -> str:
    """`?`, `42s`, `3m05s`, `1h02m`: short enough for a progress line."""
    if seconds is None:
        return "?"
    s = max(0, round(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


def render_bar(fraction: float, cells: int) -> str:
    fraction = max(0.0, min(1.0, fraction))
    full = int(fraction * cells)
    head = ">" if full < cells and fraction > 0 else ""
    return "[" + ("=" * full + head).ljust(cells) + "]"


def format_progress(step: int, max_steps: int, loss: float | None, it_s: float | None,
                    eta_s: float | None, elapsed_s: float, width: int | None = None,
                    loss_avg: float | None = None) -> str:
    """One progress line: `step 120/400 [====>   ]  30% loss 0.5120 (avg 0.5480), 1.31 it/s, ...`.

    `width` None: no bar (a log line). Otherwise the line fits in `width` characters (a
    terminal row; a longer one would wrap, and a carriage return redraws only the last
    row): the bar shrinks first, then disappears, then the tail is cut.
    """
    fraction = step / max_steps if max_steps else 0.0
    head = f"step {step}/{max_steps}"
    percent = f"{fraction:4.0%}"
    parts = []
    if loss is not None:
        parts.append(f"loss {loss:.4f}" + ("" if loss_avg is None else f" (avg {loss_avg:.4f})"))
    parts.append("? it/s" if not it_s else f"{it_s:.2f} it/s")
    parts.append(f"eta {format_duration(eta_s)}")
    parts.append(f"elapsed {format_duration(elapsed_s)}")
    tail = ", ".join(parts)
    if width is None:
        return f"{head} ({percent.strip()}) {tail}"
    cells = min(BAR_MAX, width - len(head) - len(percent) - len(tail) - 5)
    if cells >= BAR_MIN:
        return f"{head} {render_bar(fraction, cells)} {percent} {tail}"
    return f"{head} {percent} {tail}"[:max(0, width)]

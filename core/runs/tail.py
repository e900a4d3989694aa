"""Follow a run's log and events.jsonl by byte offset.

Readers poll (the UI on a timer, the CLI in a loop): each call reads only the bytes
written since the last one. Both tails survive the file not existing yet and being
truncated or replaced (the offset goes back to 0), and leave an incomplete last line
for the next call, so a line is never split in two or parsed half-written.
"""

from __future__ import annotations

import codecs
import json
import logging
import os
from pathlib import Path
from typing import Any

from core.runs.progress import strip_escapes

log = logging.getLogger(__name__)

READ_CHUNK = 4 << 20  # at most this many bytes per call, so one poll stays cheap


def collapse_cr(line: str) -> str:
    """What a terminal shows for a line with `\\r` progress updates: the last segment,
    without control sequences (tqdm's cursor moves between nested bars, colours).

    An empty segment (a `\\r\\n` line end, tqdm's final redraw, a bare cursor move) is
    not a new one: the bar's last state stays.
    """
    segments = [s for s in strip_escapes(line).split("\r") if s]
    return segments[-1] if segments else ""


class _ByteTail:
    """New bytes of a file since the last read; resets when it shrinks or is replaced."""

    def __init__(self, path: str | Path, from_end: int | None = None, offset: int = 0):
        self.path = Path(path)
        self.offset = offset
        self._inode: int | None = None
        self._from_end = from_end  # first read starts this many bytes before the end
        self.started_mid = False  # the first read began inside the file (from_end)

    def _reset(self) -> None:
        self.offset = 0
        self.started_mid = False
        self.on_reset()

    def on_reset(self) -> None:  # subclasses drop their partial-line state
        pass

    def read_bytes(self) -> bytes:
        try:
            with open(self.path, "rb") as fh:
                st = os.fstat(fh.fileno())
                replaced = self._inode is not None and st.st_ino != self._inode
                if replaced or st.st_size < self.offset:
                    self._reset()
                self._inode = st.st_ino
                if self._from_end is not None:
                    self.offset = max(0, st.st_size - self._from_end)
                    if self.offset > 0:  # mid-line unless the byte before is a newline
                        fh.seek(self.offset - 1)
                        self.started_mid = fh.read(1) != b"\n"
                    self._from_end = None
                fh.seek(self.offset)
                data = fh.read(READ_CHUNK)
        except FileNotFoundError:
            if self._inode is not None:  # deleted: start over when it comes back
                self._inode = None
                self._reset()
            return b""
        self.offset += len(data)
        return data


class LogTail(_ByteTail):
    """Complete new lines of a log, with `\\r` progress collapsed.

    `read()` returns the complete lines written since the last call; `partial` is the
    incomplete last line (collapsed), e.g. a tqdm bar that has not ended its line yet,
    for a live progress display. `from_end=N` starts the first read N bytes before the
    end (skipping to the next line start), for attaching to a long log; `offset` starts
    at a known byte offset instead (e.g. `RunHandle.log_offset`, where this run began).
    """

    def __init__(self, path: str | Path, from_end: int | None = None, offset: int = 0):
        super().__init__(path, from_end, offset)
        self.on_reset()

    def on_reset(self) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._pending = ""

    @property
    def partial(self) -> str:
        return collapse_cr(self._pending)

    def read(self) -> list[str]:
        data = self.read_bytes()
        if not data:
            return []
        text = self._pending + self._decoder.decode(data)
        parts = text.split("\n")
        self._pending = parts.pop()  # "" when the data ended with a newline
        if self.started_mid and parts:  # the first line began before our start: drop it
            parts = parts[1:]
            self.started_mid = False
        return [collapse_cr(p) for p in parts]


class EventTail(_ByteTail):
    """Parsed JSON objects of the complete new lines of events.jsonl.

    A half-written last line waits for the next call; a line that is not a JSON object
    is skipped, counted in `bad_lines` and logged once per line.
    """

    def __init__(self, path: str | Path):
        super().__init__(path)
        self.bad_lines = 0
        self.on_reset()

    def on_reset(self) -> None:
        self._pending = b""

    def read(self) -> list[dict[str, Any]]:
        data = self._pending + self.read_bytes()
        lines = data.split(b"\n")
        self._pending = lines.pop()
        events = []
        for raw in lines:
            if not raw.strip():
                continue
            try:
                obj = json.loads(raw.decode("utf-8"))
            except (UnicodeDecodeError, ValueError):
                obj = None
            if isinstance(obj, dict):
                events.append(obj)
            else:
                self.bad_lines += 1
                log.warning("%s: skipped a line that is not a JSON object: %.120r",
                            self.path, raw)
        return events


def last_lines(path: str | Path, n: int = 20, max_bytes: int = 64 << 10) -> list[str]:
    """The last `n` non-empty lines of a log (collapsed), for error messages."""
    try:
        with open(path, "rb") as fh:
            size = fh.seek(0, os.SEEK_END)
            fh.seek(max(0, size - max_bytes))
            text = fh.read().decode("utf-8", "replace")
    except OSError:
        return []
    lines = [collapse_cr(line) for line in text.split("\n")]
    return [line for line in lines if line.strip()][-n:]

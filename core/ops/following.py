"""What the UI reads to follow runs and jobs it did not start itself: run folders, their
status, log and event tails, the handles it reattaches to. Re-exported from core.runs,
core.cache and core.caption (all light: no torch), so the UI reaches them through the
actions only."""

from __future__ import annotations

from core.cache.job import CacheJob
from core.caption.job import CaptionJob
from core.runs.folder import RunFolder
from core.runs.follow import SERIES, RunFollower
from core.runs.manager import RunHandle, attach
from core.runs.memory import format_memory
from core.runs.registry import RunInfo, run_info
from core.runs.status import LIVE_STATES, read_status
from core.runs.tail import LogTail, last_lines
from core.train.grid import grid_steps

__all__ = ["LIVE_STATES", "SERIES", "CacheJob", "CaptionJob", "LogTail", "RunFolder",
           "RunFollower", "RunHandle", "RunInfo", "attach", "format_memory", "grid_steps",
           "last_lines", "read_status", "run_info"]

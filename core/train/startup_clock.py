"""Where a launch's time went before its first step: a `startup` event and a log line.

    started in 9.4 s: launcher 2.9, interpreter 0.2, imports 3.1, accelerator 0.4, model 1.1,
    caches 0.3, setup 0.5, eval set 0.1, eval 0.4, validation 0.7, first step 0.5

The phases, in order:
- launcher: from the run manager starting `accelerate launch` to this process existing
  (accelerate's own imports, then the worker's start; the manager passes the time in
  `LAUNCHED_AT_ENV`; absent when the trainer was started by hand),
- interpreter: this process's start to `main` (Python, argument parsing, the config),
- imports: torch, accelerate, diffusers, transformers and peft, imported once, up front,
- accelerator, model (load or build), caches (check, build what is missing), setup
  (adapter, optimizer, validation prompts, prepare), eval set (the held-out batches), eval
  and validation before training (each only when asked), first step.

bench/startup.py launches the demo a few times and reads these events.
"""

from __future__ import annotations

import os
import time
from typing import Any

from core.runs.pids import LAUNCHED_AT_ENV

# The libraries every training process needs; importing them here, timed, instead of
# inside whichever function first needs them, keeps "model" the model's load alone.
HEAVY_MODULES = ("torch", "accelerate", "diffusers", "transformers", "peft")


def process_started_at() -> float | None:
    """This process's start, in seconds since the epoch (/proc: Linux), or None."""
    try:
        stat = open("/proc/self/stat", encoding="utf-8").read()
        ticks = int(stat.rsplit(")", 1)[1].split()[19])  # field 22: start time in ticks
        uptime = float(open("/proc/uptime", encoding="utf-8").read().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return time.time() - uptime + ticks / os.sysconf("SC_CLK_TCK")


def launched_at() -> float | None:
    """When the run manager started `accelerate launch` (its environment), or None."""
    try:
        return float(os.environ[LAUNCHED_AT_ENV])
    except (KeyError, ValueError):
        return None


class StartupClock:
    """Phase durations, each measured from the end of the one before."""

    def __init__(self, own_process: bool = True) -> None:
        """`own_process` False (the trainer called inside another program, as tests do):
        the clock starts now, without the launcher and interpreter phases."""
        self.phases: dict[str, float] = {}
        started = process_started_at() if own_process else None
        launched = launched_at() if own_process else None
        if launched is not None and started is not None:
            self.phases["launcher"] = max(0.0, started - launched)
        self._last = time.time()
        if started is not None:
            self.phases["interpreter"] = max(0.0, self._last - started)

    def mark(self, phase: str) -> None:
        """`phase` ended now (a phase marked twice adds up)."""
        now = time.time()
        self.phases[phase] = self.phases.get(phase, 0.0) + now - self._last
        self._last = now

    def import_libraries(self) -> None:
        import importlib

        for name in HEAVY_MODULES:
            importlib.import_module(name)
        self.mark("imports")

    def total(self) -> float:
        return sum(self.phases.values())

    def summary(self) -> dict[str, Any]:
        return {"phases": {k: round(v, 3) for k, v in self.phases.items()},
                "total_s": round(self.total(), 3)}

    def line(self) -> str:
        parts = ", ".join(f"{name.replace('_', ' ')} {seconds:.1f}"
                          for name, seconds in self.phases.items())
        return f"started in {self.total():.1f} s: {parts}"

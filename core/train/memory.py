"""Memory figures the trainer reports as `memory` events: what the device's allocator
holds (CUDA) or the process's resident memory (CPU), at named phases of a run.

CUDA figures are the caching allocator's *allocated* bytes (tensors), not what
nvidia-smi shows (that adds the allocator's reserve and the CUDA context), because the
allocated figure is what the estimate in core/memory/estimate.py predicts and what
changes with the config. Host figures come from /proc/self/status, so no psutil.
"""

from __future__ import annotations

import resource
import sys
from pathlib import Path
from typing import Any

MEMORY_PHASES = ("loaded", "cached", "first_step", "peak")
# Measured apart from the steps around them, the first of each in a launch: what each
# holds beside the model, so the log says which part of a run needs the most memory.
ROUND_PHASES = ("eval", "validation", "checkpoint")
PROC_STATUS = Path("/proc/self/status")


def _proc_status_bytes(key: str) -> int | None:
    """A `kB` line of /proc/self/status (VmRSS, VmHWM) in bytes; None off Linux."""
    try:
        text = PROC_STATUS.read_text(encoding="ascii", errors="replace")
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith(key + ":"):
            fields = line.split()
            if len(fields) >= 2 and fields[1].isdigit():
                return int(fields[1]) * 1024
    return None


def max_rss_bytes() -> int:
    """The process's peak resident set size, from getrusage (KiB on Linux, bytes on macOS)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak) if sys.platform == "darwin" else int(peak) * 1024


def host_rss_bytes(peak: bool = False) -> int:
    """This process's resident memory now, or its peak so far (`peak`). Without /proc
    only the peak is known, so that stands in for the current figure."""
    found = _proc_status_bytes("VmHWM" if peak else "VmRSS")
    return found if found is not None else max_rss_bytes()


def _is_cuda(device: Any) -> bool:
    import torch

    try:
        return torch.device(device).type == "cuda"
    except (RuntimeError, TypeError, ValueError):
        return False


class MemoryTracker:
    """Snapshots for one process's device; `snapshot` returns the fields of one `memory`
    event: phase, device_bytes, device_peak_bytes (the most held since the previous
    snapshot), host_rss_bytes.

    Each snapshot resets CUDA's peak counter so the next one sees only its own interval;
    the run-wide maximum is therefore kept here, and phase "peak" reports it (and the
    host's peak RSS) instead of the figures of the moment.
    """

    def __init__(self, device: Any) -> None:
        self.device = device
        self.cuda = _is_cuda(device)
        self.run_peak_bytes = 0

    def snapshot(self, phase: str) -> dict[str, Any]:
        final = phase == "peak"
        device_bytes = device_peak_bytes = None
        if self.cuda:
            device_bytes, device_peak_bytes = self._cuda_figures()
            if final:
                device_bytes = self.run_peak_bytes
        return {"phase": phase, "device_bytes": device_bytes,
                "device_peak_bytes": device_peak_bytes,
                "host_rss_bytes": host_rss_bytes(peak=final)}

    def close_interval(self) -> None:
        """Start a new interval without an event: what was held since the previous
        snapshot counts only towards the run's peak."""
        if self.cuda:
            self._cuda_figures()

    def _cuda_figures(self) -> tuple[int, int]:
        """(allocated now, most allocated since the previous snapshot)."""
        import torch

        now = int(torch.cuda.memory_allocated(self.device))
        since = max(int(torch.cuda.max_memory_allocated(self.device)), now)
        self.run_peak_bytes = max(self.run_peak_bytes, since)
        torch.cuda.reset_peak_memory_stats(self.device)
        return now, since

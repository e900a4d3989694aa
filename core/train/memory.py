"""Memory figures the trainer reports as `memory` events: what the device's allocator
holds (CUDA) or the process's resident memory (CPU), at named phases of a run."""

from __future__ import annotations

from typing import Any

MEMORY_PHASES = ("loaded", "cached", "first_step", "peak")


class MemoryTracker:
    """Snapshots for one process's device; `snapshot` returns the fields of one `memory`
    event: phase, device_bytes, device_peak_bytes (the most held since the previous
    snapshot), host_rss_bytes."""

    def __init__(self, device: Any) -> None:
        self.device = device

    def snapshot(self, phase: str) -> dict[str, Any]:
        return {"phase": phase, "device_bytes": None, "device_peak_bytes": None,
                "host_rss_bytes": None}

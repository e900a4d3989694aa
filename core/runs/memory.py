"""The `memory` events of a run (run-folder.md) as one line for a view:

    memory: peak 14.2 GiB on the GPU (first step 13.9 GiB) · host 6.1 GiB

Pure functions of already-parsed events, so the UI and the benchmark read them alike.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

GIB = 1024 ** 3
MIB = 1024 ** 2


def fmt_bytes(n: int | float) -> str:
    """GiB with one decimal; below 1 GiB in MiB, so a tiny model does not read 0.0 GiB."""
    if n >= GIB:
        return f"{n / GIB:.1f} GiB"
    return f"{n / MIB:.0f} MiB"


def _number(event: dict[str, Any], key: str) -> int | None:
    value = event.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return int(value)


def memory_phases(events: Iterable[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The latest launch's memory events by phase (a resume appends a second launch,
    which starts again at "loaded"; mixing the two would credit one with the other's
    peak)."""
    phases: dict[str, dict[str, Any]] = {}
    for event in events:
        if event.get("type") != "memory" or not isinstance(event.get("phase"), str):
            continue
        if event["phase"] == "loaded":
            phases = {}
        phases[event["phase"]] = event
    return phases


def _device_peak(phases: dict[str, dict[str, Any]]) -> int | None:
    """The run-wide peak once the "peak" event is there, else the most seen so far."""
    final = phases.get("peak")
    if final is not None and _number(final, "device_bytes") is not None:
        return _number(final, "device_bytes")
    seen = [v for e in phases.values() for k in ("device_bytes", "device_peak_bytes")
            if (v := _number(e, k)) is not None]
    return max(seen) if seen else None


# The phases whose own peak can be the run's, as the line names them (the first step
# needs no name: the line gives its figure).
PEAK_DURING = {"loaded": "while loading", "cached": "while building the caches",
               "eval": "in the eval", "validation": "in validation",
               "checkpoint": "while saving a checkpoint"}


def _peak_during(phases: dict[str, dict[str, Any]], peak: int) -> str:
    """", in validation" when a measured phase held the run's peak, else ""."""
    for phase, words in PEAK_DURING.items():
        if _number(phases.get(phase, {}), "device_peak_bytes") == peak:
            return f", {words}"
    return ""


def host_peak(phases: dict[str, dict[str, Any]]) -> int | None:
    """The most resident host memory any phase's event reports, bytes; None without."""
    hosts = [v for e in phases.values() if (v := _number(e, "host_rss_bytes")) is not None]
    return max(hosts) if hosts else None


def format_memory(events: Iterable[dict[str, Any]]) -> str | None:
    """One line from the latest memory events; None when there are none. GPU figures
    when the events carry device bytes, otherwise the host's resident memory only."""
    phases = memory_phases(events)
    if not phases:
        return None
    first = phases.get("first_step", {})
    host = host_peak(phases)
    device = _device_peak(phases)
    if device is not None:
        first_dev = _number(first, "device_peak_bytes") or _number(first, "device_bytes")
        text = f"memory: peak {fmt_bytes(device)} on the GPU{_peak_during(phases, device)}"
        if first_dev is not None:
            text += f" (first step {fmt_bytes(first_dev)})"
        return text + (f" · host {fmt_bytes(host)}" if host is not None else "")
    if host is None:
        return None
    text = f"memory: peak {fmt_bytes(host)} host RSS"
    first_host = _number(first, "host_rss_bytes")
    return text + (f" (first step {fmt_bytes(first_host)})" if first_host is not None else "")

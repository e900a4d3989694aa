"""The flux_kontext family (FLUX.1 Kontext, an edit model): family.py (FAMILY), tiny.py
(tiny:flux_kontext)."""

from typing import Any

ORDER = 55  # place in the family lists (registry.list_families)


def __getattr__(attr: str) -> Any:
    # FAMILY imports family.py on first use: listing the families stays import-free.
    if attr == "FAMILY":
        from core.models.families.flux_kontext.family import FAMILY
        return FAMILY
    raise AttributeError(f"module {__name__!r} has no attribute {attr!r}")

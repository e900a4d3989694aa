"""The chroma family: family.py (FAMILY), tiny.py (tiny:chroma), full_size/
(random:chroma)."""

from typing import Any

ORDER = 70  # place in the family lists (registry.list_families)


def __getattr__(attr: str) -> Any:
    # FAMILY imports family.py on first use: listing the families stays import-free.
    if attr == "FAMILY":
        from core.models.families.chroma.family import FAMILY
        return FAMILY
    raise AttributeError(f"module {__name__!r} has no attribute {attr!r}")

"""The flux2 family: family.py (FAMILY), tiny.py (tiny:flux2), full_size/
(random:flux2)."""

from typing import Any

ORDER = 60  # place in the family lists (registry.list_families)


def __getattr__(attr: str) -> Any:
    # FAMILY imports family.py on first use: listing the families stays import-free.
    if attr == "FAMILY":
        from core.models.families.flux2.family import FAMILY
        return FAMILY
    raise AttributeError(f"module {__name__!r} has no attribute {attr!r}")

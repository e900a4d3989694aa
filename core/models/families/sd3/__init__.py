"""The sd3 family: family.py (FAMILY), tiny.py (tiny:sd3), full_size/
(random:sd3)."""

from typing import Any

ORDER = 40  # place in the family lists (registry.list_families)


def __getattr__(attr: str) -> Any:
    # FAMILY imports family.py on first use: listing the families stays import-free.
    if attr == "FAMILY":
        from core.models.families.sd3.family import FAMILY
        return FAMILY
    raise AttributeError(f"module {__name__!r} has no attribute {attr!r}")

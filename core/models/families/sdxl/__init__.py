"""The sdxl family: family.py (FAMILY), tiny.py (tiny:sdxl), full_size/
(random:sdxl)."""

from typing import Any

ORDER = 30  # place in the family lists (registry.list_families)


def __getattr__(attr: str) -> Any:
    # FAMILY imports family.py on first use: listing the families stays import-free.
    if attr == "FAMILY":
        from core.models.families.sdxl.family import FAMILY
        return FAMILY
    raise AttributeError(f"module {__name__!r} has no attribute {attr!r}")

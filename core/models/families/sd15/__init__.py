"""The sd15 family: family.py (FAMILY), tiny.py (tiny:sd15), full_size/
(random:sd15)."""

from typing import Any

ORDER = 10  # place in the family lists (registry.list_families); the first is the default


def __getattr__(attr: str) -> Any:
    # FAMILY imports family.py on first use: listing the families stays import-free.
    if attr == "FAMILY":
        from core.models.families.sd15.family import FAMILY
        return FAMILY
    raise AttributeError(f"module {__name__!r} has no attribute {attr!r}")

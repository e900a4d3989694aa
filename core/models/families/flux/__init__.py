"""The flux family: family.py (FAMILY), tiny.py (tiny:flux), full_size/
(random:flux)."""

from typing import Any

ORDER = 50  # place in the family lists (registry.list_families)


def __getattr__(attr: str) -> Any:
    # FAMILY imports family.py on first use: listing the families stays import-free.
    if attr == "FAMILY":
        from core.models.families.flux.family import FAMILY
        return FAMILY
    raise AttributeError(f"module {__name__!r} has no attribute {attr!r}")

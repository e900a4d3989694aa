"""The z_image family: family.py (FAMILY), tiny.py (tiny:z_image), full_size/
(random:z_image)."""

from typing import Any

ORDER = 80  # place in the family lists (registry.list_families)


def __getattr__(attr: str) -> Any:
    # FAMILY imports family.py on first use: listing the families stays import-free.
    if attr == "FAMILY":
        from core.models.families.z_image.family import FAMILY
        return FAMILY
    raise AttributeError(f"module {__name__!r} has no attribute {attr!r}")

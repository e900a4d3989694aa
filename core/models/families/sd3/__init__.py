"""The sd3 family: family.py (FAMILY), tiny.py (tiny:sd3), full_size/
(random:sd3)."""

ORDER = 40  # place in the family lists (registry.list_families)

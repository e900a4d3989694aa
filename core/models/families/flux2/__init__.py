"""The flux2 family: family.py (FAMILY), tiny.py (tiny:flux2), full_size/
(random:flux2)."""

ORDER = 60  # place in the family lists (registry.list_families)

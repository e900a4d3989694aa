"""The chroma family: family.py (FAMILY), tiny.py (tiny:chroma), full_size/
(random:chroma)."""

ORDER = 70  # place in the family lists (registry.list_families)

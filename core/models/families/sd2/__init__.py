"""The sd2 family: family.py (FAMILY), tiny.py (tiny:sd2), full_size/
(random:sd2)."""

ORDER = 20  # place in the family lists (registry.list_families)

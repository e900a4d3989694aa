"""The flux family: family.py (FAMILY), tiny.py (tiny:flux), full_size/
(random:flux)."""

ORDER = 50  # place in the family lists (registry.list_families)

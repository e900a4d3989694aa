"""The sd15 family: family.py (FAMILY), tiny.py (tiny:sd15), full_size/
(random:sd15)."""

ORDER = 10  # place in the family lists (registry.list_families); the first is the default

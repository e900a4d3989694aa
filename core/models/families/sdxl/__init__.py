"""The sdxl family: family.py (FAMILY), tiny.py (tiny:sdxl), full_size/
(random:sdxl)."""

ORDER = 30  # place in the family lists (registry.list_families)

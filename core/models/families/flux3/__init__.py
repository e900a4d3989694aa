"""The flux3 family: family.py (FAMILY), tiny.py (tiny:flux3), full_size/ (random:flux3)."""

ORDER = 62  # place in the family lists (registry.list_families): after flux2

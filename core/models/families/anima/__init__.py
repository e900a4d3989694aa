"""The anima family: family.py (FAMILY), tiny.py (tiny:anima), full_size/ (random:anima)."""

ORDER = 99  # place in the family lists (registry.list_families): after krea2

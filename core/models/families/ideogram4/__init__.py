"""The ideogram4 family: family.py (FAMILY), text.py (its packed text+image layout),
tiny.py (tiny:ideogram4), full_size/ (random:ideogram4)."""

ORDER = 65  # place in the family lists (registry.list_families): after flux2

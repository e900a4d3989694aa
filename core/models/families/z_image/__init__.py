"""The z_image family: family.py (FAMILY), tiny.py (tiny:z_image), full_size/
(random:z_image)."""

ORDER = 80  # place in the family lists (registry.list_families)

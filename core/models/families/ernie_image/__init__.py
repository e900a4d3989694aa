"""The ernie_image family: family.py (FAMILY), tiny.py (tiny:ernie_image), full_size/
(random:ernie_image)."""

ORDER = 98  # place in the family lists (registry.list_families): after krea2

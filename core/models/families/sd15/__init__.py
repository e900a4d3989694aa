"""The sd15 family: family.py (FAMILY), tiny.py (tiny:sd15), full_size/
(random:sd15), shapes/ (tiny:sd15-shapes, the demo's trained base, and its pretraining
script)."""

ORDER = 10  # place in the family lists (registry.list_families); the first is the default

"""The qwen_image family: family.py (FAMILY), tiny.py (tiny:qwen_image), full_size/
(random:qwen_image)."""

ORDER = 90  # place in the family lists (registry.list_families)

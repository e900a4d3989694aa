"""The krea2 family: family.py (FAMILY), tiny.py (tiny:krea2), full_size/ (random:krea2)."""

ORDER = 97  # place in the family lists (registry.list_families): after qwen_image_edit

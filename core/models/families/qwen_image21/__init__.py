"""The qwen_image21 family (Qwen-Image 2.1): family.py (FAMILY), processor.py (the
Qwen3VLProcessor without torchvision), checks.py (--stage check: Turbo, missing
components), tiny.py (tiny:qwen_image21), full_size/ (random:qwen_image21)."""

ORDER = 96  # place in the family lists (registry.list_families): after qwen_image_edit

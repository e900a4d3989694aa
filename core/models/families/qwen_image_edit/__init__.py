"""The qwen_image_edit family (Qwen-Image-Edit, -2509, -2511): family.py (FAMILY),
processor.py (the Qwen2VLProcessor without torchvision), validation.py (the validation
pipelines), checks.py (--stage check of the one-reference model), tiny.py
(tiny:qwen_image_edit), tiny_plus/ (tiny:qwen_image_edit_plus), full_size/
(random:qwen_image_edit)."""

ORDER = 95  # place in the family lists (registry.list_families): after qwen_image

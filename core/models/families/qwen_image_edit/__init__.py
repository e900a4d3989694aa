"""The qwen_image_edit family (Qwen-Image-Edit, -2509, -2511): family.py (FAMILY),
processor.py (the Qwen2VLProcessor without torchvision), validation.py (the validation
pipelines), checks.py (--stage check of the one-reference model), tiny.py
(tiny:qwen_image_edit), tiny_plus/ (tiny:qwen_image_edit_plus), full_size/
(random:qwen_image_edit)."""

from typing import Any

ORDER = 95  # place in the family lists (registry.list_families): after qwen_image


def __getattr__(attr: str) -> Any:
    # FAMILY imports family.py on first use: listing the families stays import-free.
    if attr == "FAMILY":
        from core.models.families.qwen_image_edit.family import FAMILY
        return FAMILY
    raise AttributeError(f"module {__name__!r} has no attribute {attr!r}")

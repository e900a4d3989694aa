"""ComfyUI 0.29.0 runs Qwen-Image-Edit as its QwenImage model (comfy/model_base.py), so the
LoRA names it maps are Qwen-Image's (qwen_image/comfyui_keys.py)."""

from core.models.families.qwen_image.comfyui_keys import LAYOUT

__all__ = ["LAYOUT"]

"""ComfyUI 0.29.0's Chroma is a Flux model (comfy/model_base.py `class Chroma(Flux)`), so
the LoRA names it maps are FLUX.1's (flux/comfyui_keys.py)."""

from core.models.families.flux.comfyui_keys import LAYOUT

__all__ = ["LAYOUT"]

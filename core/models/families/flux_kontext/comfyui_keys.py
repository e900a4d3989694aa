"""ComfyUI 0.29.0 runs FLUX.1 Kontext as its Flux model (comfy/model_base.py Flux, the
references given as `ref_latents`), so the LoRA names it maps are FLUX.1's
(flux/comfyui_keys.py)."""

from core.models.families.flux.comfyui_keys import LAYOUT

__all__ = ["LAYOUT"]

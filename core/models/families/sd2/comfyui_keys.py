"""ComfyUI 0.29.0 maps an SD2 LoRA as an SD1.5 one (sd15/comfyui_keys.py): the same UNet
names, and lora_te_ (or lora_te1_) for its one text encoder (OpenCLIP ViT-H, clip_h
there)."""

from core.models.families.sd15.comfyui_keys import LAYOUT

__all__ = ["LAYOUT"]

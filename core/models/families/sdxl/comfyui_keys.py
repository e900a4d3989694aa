"""The LoRA names ComfyUI 0.29.0 maps for SDXL (comfy/model_base.py SDXL): the UNet's as
SD1.5's (core/models/comfyui_unet.py; SDXL's first down block has no attentions), and its two
text encoders as lora_te1_ (CLIP ViT-L, clip_l) and lora_te2_ (OpenCLIP ViT-bigG,
clip_g: comfy/lora.py model_lora_keys_clip names it te2 when clip_l is present)."""

from core.models.comfyui_layout import Layout
from core.models.comfyui_unet import clip_names, unet_names

LAYOUT = Layout(model="SDXL", names=unet_names() + clip_names("te1", "text_encoder")
                + clip_names("te2", "text_encoder_2"))

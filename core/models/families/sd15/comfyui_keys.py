"""The LoRA names ComfyUI 0.29.0 maps for SD1.5 (comfy/model_base.py BaseModel): the SD
UNet's and its one CLIP text encoder's as lora_te_ (or lora_te1_), core/models/comfyui_unet.py."""

from core.models.comfyui_layout import Layout
from core.models.comfyui_unet import clip_names, unet_names

LAYOUT = Layout(model="BaseModel (SD15, SD20)",
                names=unet_names() + clip_names("te", "text_encoder")
                + clip_names("te1", "text_encoder"))

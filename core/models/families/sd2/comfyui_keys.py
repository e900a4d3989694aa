"""ComfyUI 0.29.0 maps an SD2 LoRA as an SD1.5 one: the same UNet names
(core/models/comfyui_unet.py), and lora_te_ (or lora_te1_) for its one text encoder
(OpenCLIP ViT-H, clip_h there)."""

from core.models.comfyui_layout import Layout
from core.models.comfyui_unet import clip_names, unet_names

LAYOUT = Layout(model="BaseModel (SD15, SD20)",
                names=unet_names() + clip_names("te", "text_encoder")
                + clip_names("te1", "text_encoder"))

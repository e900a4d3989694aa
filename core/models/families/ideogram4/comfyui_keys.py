"""The LoRA names ComfyUI 0.29.0 maps for Ideogram 4 (comfy/model_base.py `Ideogram4`,
comfy/ldm/ideogram4/model.py): its own weight names, "diffusion_model.<weight>", the map
comfy/lora.py model_lora_keys_unet builds for every model's weights (ComfyUI has no
diffusers-name table for Ideogram 4). Its blocks hold q, k and v in one
`attention.qkv` Linear and the output as `attention.o`; the SwiGLU keeps w1, w2, w3. So
this tool's plain LoRA fuses q/k/v into one LoRA of attention.qkv (family.py
`_save_comfy`, core/models/comfyui_names.py). See core/models/comfyui_layout.py."""

from core.models.comfyui_layout import Layout, original_names

L = "layers.{i}."

LAYOUT = Layout(model="Ideogram4", names=original_names((
    (L + "attention.qkv", (L + "attention.to_q", L + "attention.to_k", L + "attention.to_v")),
    (L + "attention.o", (L + "attention.to_out.0",)),
    (L + "feed_forward.w1", (L + "feed_forward.w1",)),
    (L + "feed_forward.w2", (L + "feed_forward.w2",)),
    (L + "feed_forward.w3", (L + "feed_forward.w3",)),
)))

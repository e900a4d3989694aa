"""The LoRA names ComfyUI 0.29.0 maps for Z-Image (comfy/model_base.py Lumina2, whose
branch of comfy/lora.py model_lora_keys_unet reads comfy/utils.py z_image_to_diffusers):
"transformer.<diffusers module>" keys of the main layers and both refiners, q/k/v as
slices of each attention's fused qkv weight (comfy/ldm/lumina/model.py). This tool's
file writes exactly these names (lora_files.save_comfy_lora). See
core/models/comfyui_layout.py."""

from core.models.comfyui_layout import Layout, sliced, transformer_names

LEAVES = (*sliced(("attention.to_q", "attention.to_k", "attention.to_v"), "attention.qkv"),
          ("attention.to_out.0", "attention.out", None),
          ("feed_forward.w1", "feed_forward.w1", None),
          ("feed_forward.w2", "feed_forward.w2", None),
          ("feed_forward.w3", "feed_forward.w3", None))

LAYOUT = Layout(model="Lumina2", names=transformer_names(tuple(
    (f"{blocks}.{{i}}.{leaf}", f"{blocks}.{{i}}.{weight}", part)
    for blocks in ("layers", "noise_refiner", "context_refiner")
    for leaf, weight, part in LEAVES)))

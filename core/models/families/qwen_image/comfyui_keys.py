"""The LoRA names ComfyUI 0.29.0 maps for Qwen-Image (comfy/model_base.py QwenImage):
its branch of comfy/lora.py model_lora_keys_unet maps "transformer.<weight>" for every
weight of its model, whose module names are diffusers' own (comfy/ldm/qwen_image/
model.py: separate to_q/k/v, img_mlp.net.0.proj, ...), so the names are
"transformer.<diffusers module>", as this tool's file writes them (lora_files.
save_comfy_lora). See core/models/comfyui_layout.py."""

from core.models.comfyui_layout import Layout, transformer_names

LEAVES = ("attn.to_q", "attn.to_k", "attn.to_v", "attn.add_q_proj", "attn.add_k_proj",
          "attn.add_v_proj", "attn.to_out.0", "attn.to_add_out", "img_mlp.net.0.proj",
          "img_mlp.net.2", "txt_mlp.net.0.proj", "txt_mlp.net.2")

LAYOUT = Layout(model="QwenImage", names=transformer_names((
    *((f"transformer_blocks.{{i}}.{leaf}",) * 2 + (None,) for leaf in LEAVES),
    ("proj_out", "proj_out", None),
)))

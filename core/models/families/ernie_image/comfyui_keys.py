"""The LoRA names ComfyUI 0.29.0 maps for ERNIE-Image (comfy/model_base.py ErnieImage): its
branch of comfy/lora.py model_lora_keys_unet maps "transformer.<weight>" for every weight
of its model, whose module names are diffusers' own (comfy/ldm/ernie/model.py:
layers.{i}.self_attention.to_q/to_k/to_v/to_out.0, layers.{i}.mlp.gate_proj/up_proj/
linear_fc2, as diffusers' single-file converter for ERNIE-Image only strips a prefix), so
the names are "transformer.<diffusers module>", as this tool's file writes them
(lora_files.save_comfy_lora). See core/models/comfyui_layout.py."""

from core.models.comfyui_layout import Layout, transformer_names

LEAVES = ("self_attention.to_q", "self_attention.to_k", "self_attention.to_v",
          "self_attention.to_out.0", "mlp.gate_proj", "mlp.up_proj", "mlp.linear_fc2")

LAYOUT = Layout(model="ErnieImage", names=transformer_names(
    tuple((f"layers.{{i}}.{leaf}",) * 2 + (None,) for leaf in LEAVES)))

"""The LoRA names ComfyUI 0.29.0 maps for HunyuanVideo 1.5 (comfy/model_base.py
`class HunyuanVideo15(HunyuanVideo)`, whose double blocks are FLUX.1's
(comfy/ldm/flux/layers.py DoubleStreamBlock): q, k and v in one img_attn.qkv /
txt_attn.qkv weight). Its branch of comfy/lora.py model_lora_keys_unet maps the weights
under diffusion-pipe's spelling (img_attn_qkv, img_attn_proj, img_mlp.fc1,
img_mod.linear, after "diffusion_model." or "transformer."), which this tool's file uses
(family.ORIGINAL_NAMES and FUSED); no name reaches a part of the fused qkv, so separate
q/k/v LoRAs are dropped there and plain LoRA's are written fused. See
core/models/comfyui_layout.py."""

from core.models.comfyui_layout import Layout, Name

B, D = "double_blocks.{i}.", "transformer_blocks.{i}."
# (ComfyUI's LoRA leaf, its model's weight leaf, the diffusers modules it carries)
ROWS = (
    ("img_attn_qkv", "img_attn.qkv", ("attn.to_q", "attn.to_k", "attn.to_v")),
    ("txt_attn_qkv", "txt_attn.qkv", ("attn.add_q_proj", "attn.add_k_proj",
                                      "attn.add_v_proj")),
    ("img_attn_proj", "img_attn.proj", ("attn.to_out.0",)),
    ("txt_attn_proj", "txt_attn.proj", ("attn.to_add_out",)),
    ("img_mlp.fc1", "img_mlp.0", ("ff.net.0.proj",)),
    ("img_mlp.fc2", "img_mlp.2", ("ff.net.2",)),
    ("txt_mlp.fc1", "txt_mlp.0", ("ff_context.net.0.proj",)),
    ("txt_mlp.fc2", "txt_mlp.2", ("ff_context.net.2",)),
    ("img_mod.linear", "img_mod.lin", ("norm1.linear",)),
    ("txt_mod.linear", "txt_mod.lin", ("norm1_context.linear",)),
)

LAYOUT = Layout(model="HunyuanVideo15", names=tuple(
    Name(f"{prefix}{B}{leaf}", B + weight, tuple(D + m for m in modules))
    for prefix in ("diffusion_model.", "transformer.") for leaf, weight, modules in ROWS))

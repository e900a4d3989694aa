"""The LoRA names ComfyUI 0.29.0 maps for FLUX.1 (comfy/model_base.py Flux; ComfyUI's Chroma
and FLUX.1 Kontext are Flux models too, and their families use this layout):
"transformer.<diffusers module>" keys through comfy/utils.py flux_to_diffusers, q/k/v
(and a single block's proj_mlp) as slices of the fused weights ComfyUI's model holds
(comfy/ldm/flux/layers.py: img_attn.qkv, single blocks' linear1 = q, k, v and the MLP's
input, mlp_ratio 4). This tool's file writes exactly these names (lora_files.
save_comfy_lora). See core/models/comfyui_layout.py."""

from core.models.comfyui_layout import Layout, sliced, transformer_names

D, S = "transformer_blocks.{i}.", "single_transformer_blocks.{i}."
DOUBLE, SINGLE = "double_blocks.{i}.", "single_blocks.{i}."
QKV = ("attn.to_q", "attn.to_k", "attn.to_v")
ADDED_QKV = ("attn.add_q_proj", "attn.add_k_proj", "attn.add_v_proj")

LAYOUT = Layout(model="Flux", names=transformer_names((
    *sliced(tuple(D + m for m in QKV), DOUBLE + "img_attn.qkv"),
    *sliced(tuple(D + m for m in ADDED_QKV), DOUBLE + "txt_attn.qkv"),
    (D + "attn.to_out.0", DOUBLE + "img_attn.proj", None),
    (D + "attn.to_add_out", DOUBLE + "txt_attn.proj", None),
    (D + "ff.net.0.proj", DOUBLE + "img_mlp.0", None),
    (D + "ff.net.2", DOUBLE + "img_mlp.2", None),
    (D + "ff_context.net.0.proj", DOUBLE + "txt_mlp.0", None),
    (D + "ff_context.net.2", DOUBLE + "txt_mlp.2", None),
    # linear1's outputs: q, k, v (the hidden size each), then the MLP's 4x hidden
    *sliced(tuple(S + m for m in QKV), SINGLE + "linear1", total=7),
    (S + "proj_mlp", SINGLE + "linear1", (3, 7, 7)),
    (S + "proj_out", SINGLE + "linear2", None),
    ("proj_out", "final_layer.linear", None),
    ("x_embedder", "img_in", None),
    ("context_embedder", "txt_in", None),
)))

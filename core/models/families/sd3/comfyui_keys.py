"""The LoRA names ComfyUI 0.29.0 maps for SD3 (comfy/model_base.py SD3):
"transformer.<diffusers module>" keys through comfy/utils.py mmdit_to_diffusers, onto
its MMDiT's joint_blocks (comfy/ldm/modules/diffusionmodules/mmdit.py), q/k/v as slices
of each attention's fused qkv weight; attn2 is SD3.5's second image attention. This
tool's file writes exactly these names (lora_files.save_comfy_lora). See
core/models/comfyui_layout.py."""

from core.models.comfyui_layout import Layout, sliced, transformer_names
from core.models.families.flux.comfyui_keys import ADDED_QKV, QKV

D, J = "transformer_blocks.{i}.", "joint_blocks.{i}."
X, C = J + "x_block.", J + "context_block."
QKV2 = tuple(m.replace("attn.", "attn2.") for m in QKV)

LAYOUT = Layout(model="SD3", names=transformer_names((
    *sliced(tuple(D + m for m in QKV), X + "attn.qkv"),
    *sliced(tuple(D + m for m in ADDED_QKV), C + "attn.qkv"),
    *sliced(tuple(D + m for m in QKV2), X + "attn2.qkv"),
    (D + "attn.to_out.0", X + "attn.proj", None),
    (D + "attn.to_add_out", C + "attn.proj", None),
    (D + "attn2.to_out.0", X + "attn2.proj", None),
    (D + "ff.net.0.proj", X + "mlp.fc1", None),
    (D + "ff.net.2", X + "mlp.fc2", None),
    (D + "ff_context.net.0.proj", C + "mlp.fc1", None),
    (D + "ff_context.net.2", C + "mlp.fc2", None),
    ("proj_out", "final_layer.linear", None),
    ("context_embedder", "context_embedder", None),
)))

"""The LoRA names ComfyUI 0.29.0 maps for FLUX.2 (comfy/model_base.py `class Flux2(Flux)`),
both of which this tool's file uses (lora.py):

- BFL's own weight names, "diffusion_model.<weight>" (the map comfy/lora.py
  model_lora_keys_unet builds for every model's weights): plain LoRA, q/k/v fused into
  one LoRA of the double blocks' img_attn.qkv / txt_attn.qkv;
- "transformer.<diffusers module>" through comfy/utils.py flux_to_diffusers (Flux's table,
  with FLUX.2's ff.linear_in/out and single blocks' attn.to_qkv_mlp_proj / attn.to_out):
  DoRA, LoKr and LoHa, q/k/v as slices of the fused weights.

See core/models/comfyui_layout.py."""

from core.models.comfyui_layout import Layout, original_names, sliced, transformer_names
from core.models.families.flux.comfyui_keys import ADDED_QKV, QKV

D, S = "transformer_blocks.{i}.", "single_transformer_blocks.{i}."
DOUBLE, SINGLE = "double_blocks.{i}.", "single_blocks.{i}."
# (BFL weight, diffusers module) of every unfused Linear a LoRA here reaches
PLAIN = (
    (DOUBLE + "img_attn.proj", D + "attn.to_out.0"),
    (DOUBLE + "txt_attn.proj", D + "attn.to_add_out"),
    (DOUBLE + "img_mlp.0", D + "ff.linear_in"),
    (DOUBLE + "img_mlp.2", D + "ff.linear_out"),
    (DOUBLE + "txt_mlp.0", D + "ff_context.linear_in"),
    (DOUBLE + "txt_mlp.2", D + "ff_context.linear_out"),
    (SINGLE + "linear1", S + "attn.to_qkv_mlp_proj"),
    (SINGLE + "linear2", S + "attn.to_out"),
    ("final_layer.linear", "proj_out"),
    ("img_in", "x_embedder"),
    ("txt_in", "context_embedder"),
)

QKV_D, ADDED_QKV_D = tuple(D + m for m in QKV), tuple(D + m for m in ADDED_QKV)

LAYOUT = Layout(model="Flux2", names=original_names((
    (DOUBLE + "img_attn.qkv", QKV_D),
    (DOUBLE + "txt_attn.qkv", ADDED_QKV_D),
    *((weight, (module,)) for weight, module in PLAIN),
)) + transformer_names((
    *sliced(QKV_D, DOUBLE + "img_attn.qkv"),
    *sliced(ADDED_QKV_D, DOUBLE + "txt_attn.qkv"),
    *((module, weight, None) for weight, module in PLAIN),
)))

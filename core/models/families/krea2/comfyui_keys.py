"""The LoRA names ComfyUI 0.29.0 maps for Krea 2 (comfy/model_base.py Krea2): its branch
of comfy/lora.py model_lora_keys_unet maps "transformer.<diffusers module>" (and
"diffusion_model.<diffusers module>", "lycoris_...") for every diffusers weight that
comfy/utils.py krea2_to_diffusers translates onto Krea's own names (comfy/ldm/krea2/
model.py: blocks.{i}.attn.wq/wk/wv/gate/wo, mlp.gate/up/down, txtfusion.*, first,
last.linear, tmlp.*, tproj.1, txtmlp.*). The file writes "transformer.<diffusers
module>" (lora_files.save_comfy_lora). See core/models/comfyui_layout.py."""

from core.models.comfyui_layout import Layout, transformer_names

# diffusers leaf -> Krea's leaf, in each transformer block and text-fusion block
LEAVES = (("attn.to_q", "attn.wq"), ("attn.to_k", "attn.wk"), ("attn.to_v", "attn.wv"),
          ("attn.to_gate", "attn.gate"), ("attn.to_out.0", "attn.wo"),
          ("ff.gate", "mlp.gate"), ("ff.up", "mlp.up"), ("ff.down", "mlp.down"))
BLOCKS = (("transformer_blocks.{i}", "blocks.{i}"),
          ("text_fusion.layerwise_blocks.{i}", "txtfusion.layerwise_blocks.{i}"),
          ("text_fusion.refiner_blocks.{i}", "txtfusion.refiner_blocks.{i}"))
BASIC = (("img_in", "first"), ("time_embed.linear_1", "tmlp.0"),
         ("time_embed.linear_2", "tmlp.2"), ("time_mod_proj", "tproj.1"),
         ("txt_in.linear_1", "txtmlp.1"), ("txt_in.linear_2", "txtmlp.3"),
         ("text_fusion.projector", "txtfusion.projector"),
         ("final_layer.linear", "last.linear"))

LAYOUT = Layout(model="Krea2", names=transformer_names((
    *((f"{block}.{leaf}", f"{ours}.{theirs}", None)
      for block, ours in BLOCKS for leaf, theirs in LEAVES),
    *((d, c, None) for d, c in BASIC),
)))

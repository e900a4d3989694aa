"""The LoRA names ComfyUI 0.29.0 maps for Wan 2.1 and 2.2 (comfy/model_base.py WAN21,
WAN22; each Wan 2.2 A14B expert is a model of its own there): Wan's original weight
names under "diffusion_model." (the map comfy/lora.py model_lora_keys_unet builds for
every model's weights; comfy/ldm/wan/model.py: self_attn.q/k/v/o, cross_attn.q/k/v/o and
an I2V model's k_img/v_img, ffn.0/ffn.2), as this tool's file writes them
(comfy.ORIGINAL_NAMES). See core/models/comfyui_layout.py."""

from core.models.comfyui_layout import Layout, original_names

B = "blocks.{i}."
LEAVES = (("self_attn.q", "attn1.to_q"), ("self_attn.k", "attn1.to_k"),
          ("self_attn.v", "attn1.to_v"), ("self_attn.o", "attn1.to_out.0"),
          ("cross_attn.q", "attn2.to_q"), ("cross_attn.k", "attn2.to_k"),
          ("cross_attn.v", "attn2.to_v"), ("cross_attn.o", "attn2.to_out.0"),
          ("cross_attn.k_img", "attn2.add_k_proj"), ("cross_attn.v_img", "attn2.add_v_proj"),
          ("ffn.0", "ffn.net.0.proj"), ("ffn.2", "ffn.net.2"))

LAYOUT = Layout(model="WAN21", names=original_names(tuple(
    (B + weight, (B + module,)) for weight, module in LEAVES)))

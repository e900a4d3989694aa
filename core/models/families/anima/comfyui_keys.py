"""The LoRA names ComfyUI 0.29.0 maps for Anima (comfy/model_base.py Anima, the Cosmos-
Predict2 MiniTrainDIT of comfy/ldm/cosmos/predict2.py with the LLM adapter of
comfy/ldm/anima/model.py): comfy/lora.py has no Anima branch, so its names are the
generic map model_lora_keys_unet builds for every model, "diffusion_model.<weight>" of
the model's own weights: blocks.{i}.self_attn / cross_attn .q_proj, .k_proj, .v_proj,
.output_proj, mlp.layer1 / layer2, and the adaLN modulation Linears
adaln_modulation_self_attn / _cross_attn / _mlp .1 and .2. diffusion-pipe writes its Anima
LoRAs so (without `.alpha`, which ComfyUI reads and this file carries; diffusers' Anima
loader converts such names back but refuses the `.alpha` keys: diffusers loads the
pytorch_lora_weights.safetensors beside it). See core/models/comfyui_layout.py."""

from core.models.comfyui_layout import Layout, original_names

B = "blocks.{i}."
# (ComfyUI's leaf, diffusers' leaf) inside each DiT block
LEAVES = (("self_attn.q_proj", "attn1.to_q"), ("self_attn.k_proj", "attn1.to_k"),
          ("self_attn.v_proj", "attn1.to_v"), ("self_attn.output_proj", "attn1.to_out.0"),
          ("cross_attn.q_proj", "attn2.to_q"), ("cross_attn.k_proj", "attn2.to_k"),
          ("cross_attn.v_proj", "attn2.to_v"), ("cross_attn.output_proj", "attn2.to_out.0"),
          ("mlp.layer1", "ff.net.0.proj"), ("mlp.layer2", "ff.net.2"),
          ("adaln_modulation_self_attn.1", "norm1.linear_1"),
          ("adaln_modulation_self_attn.2", "norm1.linear_2"),
          ("adaln_modulation_cross_attn.1", "norm2.linear_1"),
          ("adaln_modulation_cross_attn.2", "norm2.linear_2"),
          ("adaln_modulation_mlp.1", "norm3.linear_1"),
          ("adaln_modulation_mlp.2", "norm3.linear_2"))

LAYOUT = Layout(model="Anima", names=original_names(tuple(
    (B + weight, ("transformer_blocks.{i}." + module,)) for weight, module in LEAVES)))

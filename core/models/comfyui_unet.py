"""The LoRA names ComfyUI 0.29.0 maps for a Stable Diffusion UNet and its CLIP text
encoders, shared by the UNet families' comfyui_keys.py (their layouts are built from
`unet_names` and `clip_names`), which this tool's kohya file (lora_kohya.safetensors) uses:

- the UNet: kohya's "lora_unet_<diffusers module, dots as underscores>" for every module
  of comfy/utils.py unet_to_diffusers (comfy/lora.py model_lora_keys_unet maps each onto
  its LDM weight, input_blocks / middle_block / output_blocks numbered by ComfyUI from the
  model's config: `weight` below writes that number {n}): the transformer blocks'
  attentions and feed-forwards, each attention's proj_in / proj_out, and the resnets'
  conv1, conv2, time_emb_proj and conv_shortcut (skip_connection);
- the text encoders (comfy/lora.py model_lora_keys_clip, its LORA_CLIP_MAP):
  "lora_te_text_model_encoder_layers_<i>_<self_attn_q_proj ...>" for SD1.5's and SD2's
  one encoder (lora_te1_ too), lora_te1_ and lora_te2_ for SDXL's two.

See core/models/comfyui_layout.py."""

from core.models.comfyui_layout import Name

ATTENTIONS = {"down_blocks.{i}.attentions.{j}": "input_blocks.{n}.1",
              "mid_block.attentions.{j}": "middle_block.1",
              "up_blocks.{i}.attentions.{j}": "output_blocks.{n}.1"}
RESNETS = {"down_blocks.{i}.resnets.{j}": "input_blocks.{n}.0",
           "mid_block.resnets.{j}": "middle_block.{n}",
           "up_blocks.{i}.resnets.{j}": "output_blocks.{n}.0"}
# diffusers leaf -> LDM leaf (the same inside a transformer block)
ATTENTION_LEAVES = {"proj_in": "proj_in", "proj_out": "proj_out",
                    **{f"transformer_blocks.{{k}}.{leaf}": f"transformer_blocks.{{k}}.{leaf}"
                       for leaf in ("attn1.to_q", "attn1.to_k", "attn1.to_v", "attn1.to_out.0",
                                    "attn2.to_q", "attn2.to_k", "attn2.to_v", "attn2.to_out.0",
                                    "ff.net.0.proj", "ff.net.2")}}
RESNET_LEAVES = {"conv1": "in_layers.2", "conv2": "out_layers.3",
                 "time_emb_proj": "emb_layers.1", "conv_shortcut": "skip_connection"}
# the text encoders' Linears ComfyUI maps, diffusers (CLIP) leaf -> kohya leaf
CLIP_LEAVES = {"self_attn.q_proj": "self_attn_q_proj", "self_attn.k_proj": "self_attn_k_proj",
               "self_attn.v_proj": "self_attn_v_proj", "self_attn.out_proj": "self_attn_out_proj",
               "mlp.fc1": "mlp_fc1", "mlp.fc2": "mlp_fc2"}


def unet_names() -> tuple[Name, ...]:
    """lora_unet_<module> for the attentions' and the resnets' modules."""
    names = []
    for blocks, leaves in ((ATTENTIONS, ATTENTION_LEAVES), (RESNETS, RESNET_LEAVES)):
        for head, ldm_head in blocks.items():
            for leaf, ldm_leaf in leaves.items():
                module = f"{head}.{leaf}"
                names.append(Name("lora_unet_" + module.replace(".", "_"),
                                  f"{ldm_head}.{ldm_leaf}", (module,)))
    return tuple(names)


def clip_names(kohya: str, encoder: str) -> tuple[Name, ...]:
    """lora_<kohya>_text_model_encoder_layers_{i}_<leaf> of the diffusers text encoder
    `encoder` (text_encoder, text_encoder_2); `weight` is ComfyUI's CLIP key after its
    clip_l. / clip_g. / clip_h. prefix."""
    return tuple(Name(f"lora_{kohya}_text_model_encoder_layers_{{i}}_{leaf}",
                      f"transformer.text_model.encoder.layers.{{i}}.{module}",
                      (f"{encoder}.text_model.encoder.layers.{{i}}.{module}",))
                 for module, leaf in CLIP_LEAVES.items())


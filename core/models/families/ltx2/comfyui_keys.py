"""The LoRA names ComfyUI 0.29.0 maps for LTX-2 (comfy/model_base.py LTXAV): the original
weight names under "diffusion_model." (the map comfy/lora.py model_lora_keys_unet builds
for every model's weights; its LTXAV branch also maps them without the prefix), which for
the attentions and feed-forwards of comfy/ldm/lightricks/av_model.py are diffusers' own
module names, as this tool's file writes them (lora.py). See
core/models/comfyui_layout.py."""

from core.models.comfyui_layout import Layout, original_names

ATTENTIONS = ("attn1", "attn2", "audio_attn1", "audio_attn2", "audio_to_video_attn",
              "video_to_audio_attn")
LEAVES = (*(f"{a}.{p}" for a in ATTENTIONS for p in ("to_q", "to_k", "to_v", "to_out.0")),
          *(f"{ff}.{p}" for ff in ("ff", "audio_ff") for p in ("net.0.proj", "net.2")))

LAYOUT = Layout(model="LTXAV", names=original_names(tuple(
    (f"transformer_blocks.{{i}}.{leaf}", (f"transformer_blocks.{{i}}.{leaf}",))
    for leaf in LEAVES)))

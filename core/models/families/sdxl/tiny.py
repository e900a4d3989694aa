"""Tiny random SDXL: the tiny SD1.5 parts with SDXL's differences, a second CLIP encoder
with a projection (its pooled output feeds the UNet's text_time embedding), size/crop
ids, the Euler schedule and SDXL's VAE scaling."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from core.models.tiny.clip import clip_tokenizer, tiny_clip_config
from core.models.tiny.unet import unet_parts

SDXL_VAE_SCALING = 0.13025  # the real SDXL VAE's, before calibration
# cross_attention_dim = 32 + 32 (both encoders' hidden sizes, concatenated); the add
# embedding takes 6 time ids x 8 plus the 32-wide pooled projection.
SDXL_UNET = {"cross_attention_dim": 64, "use_linear_projection": True,
             "attention_head_dim": (2, 4), "addition_embed_type": "text_time",
             "addition_time_embed_dim": 8, "projection_class_embeddings_input_dim": 80}


def euler_scheduler() -> Any:
    from diffusers import EulerDiscreteScheduler

    return EulerDiscreteScheduler(beta_start=0.00085, beta_end=0.012,
                                  beta_schedule="scaled_linear", num_train_timesteps=1000,
                                  steps_offset=1, timestep_spacing="leading",
                                  prediction_type="epsilon")


def build(out_dir: Path, seed: int = 0) -> None:
    """Write a tiny random SDXL as a diffusers folder."""
    import torch
    from diffusers import StableDiffusionXLPipeline
    from transformers import CLIPTextModelWithProjection

    parts = unet_parts(out_dir, seed, euler_scheduler, unet_extra=SDXL_UNET,
                       vae_scaling=SDXL_VAE_SCALING)
    torch.manual_seed(seed + 3)
    text_encoder_2 = CLIPTextModelWithProjection(
        tiny_clip_config(hidden_act="gelu", projection_dim=32))
    tokenizer_2 = clip_tokenizer(Path(out_dir) / "tokenizer_2", pad_token="!")
    pipe = StableDiffusionXLPipeline(**parts, text_encoder_2=text_encoder_2,
                                     tokenizer_2=tokenizer_2, feature_extractor=None,
                                     add_watermarker=False)
    pipe.save_pretrained(str(out_dir), safe_serialization=True)

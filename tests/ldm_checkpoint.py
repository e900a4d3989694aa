"""Tiny diffusers folders written as original-layout (LDM: A1111/ComfyUI) single-file
checkpoints, the way people download them (fp16), with core/models/ldm_checkpoint.py's
mapping, and a tiny SDXL whose two text encoders differ in width. No tests here."""

from __future__ import annotations

from pathlib import Path

from core.models import ldm_checkpoint
from core.models.registry import get_family


def write_single_file(folder: Path, family: str, out: Path) -> Path:
    """The folder as one fp16 .safetensors in the original layout (as checkpoints ship)."""
    import torch

    return ldm_checkpoint.write_single_file(
        folder, get_family(family).single_file.checkpoint_text_encoders, out, torch.float16)


SDXL_TEXT_2_WIDTH = 48


def build_sdxl_with_distinct_encoders(out_dir: Path, seed: int = 0) -> Path:
    """The tiny SDXL with its second text encoder wider than the first (32 and 48), as in
    the real model (768 and 1280). The plain tiny SDXL has two 32-wide encoders, and
    diffusers' single-file loader tells SDXL's two encoders apart by width: with equal
    widths it fills text_encoder_2 from the first encoder's weights."""
    import torch
    from diffusers import StableDiffusionXLPipeline
    from transformers import CLIPTextModelWithProjection

    from core.models.families.sdxl.tiny import SDXL_UNET, SDXL_VAE_SCALING, euler_scheduler
    from core.models.tiny.clip import clip_tokenizer, tiny_clip_config
    from core.models.tiny.unet import unet_parts

    unet = {**SDXL_UNET, "cross_attention_dim": 32 + SDXL_TEXT_2_WIDTH}
    parts = unet_parts(out_dir, seed, euler_scheduler, unet_extra=unet,
                       vae_scaling=SDXL_VAE_SCALING)
    torch.manual_seed(seed + 3)
    text_encoder_2 = CLIPTextModelWithProjection(tiny_clip_config(
        hidden_size=SDXL_TEXT_2_WIDTH, hidden_act="gelu", projection_dim=32))
    tokenizer_2 = clip_tokenizer(Path(out_dir) / "tokenizer_2", pad_token="!")
    pipe = StableDiffusionXLPipeline(**parts, text_encoder_2=text_encoder_2,
                                     tokenizer_2=tokenizer_2, feature_extractor=None,
                                     add_watermarker=False)
    pipe.save_pretrained(str(out_dir), safe_serialization=True)
    return Path(out_dir)

"""Tiny random SD1.5: an SD1.5-shaped UNet (block_out_channels (32, 64), cross-attention
width 32), a calibrated 4-channel VAE, a 3-layer CLIP text encoder and the byte-level
tokenizer: core/models/tiny/unet.py's parts with SD1.5's schedule.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from core.models.tiny.unet import unet_parts


def pndm_scheduler() -> Any:
    """SD1.5's training schedule (scaled-linear betas), epsilon prediction."""
    from diffusers import PNDMScheduler

    return PNDMScheduler(beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear",
                         num_train_timesteps=1000, skip_prk_steps=True,
                         set_alpha_to_one=False, steps_offset=1, prediction_type="epsilon")


def build(out_dir: Path, seed: int = 0) -> None:
    """Write a tiny random SD1.5 as a diffusers folder."""
    from diffusers import StableDiffusionPipeline

    parts = unet_parts(out_dir, seed, pndm_scheduler)
    pipe = StableDiffusionPipeline(**parts, safety_checker=None, feature_extractor=None,
                                   requires_safety_checker=False)
    pipe.save_pretrained(str(out_dir), safe_serialization=True)

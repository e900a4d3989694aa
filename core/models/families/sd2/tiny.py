"""Tiny random SD2: the tiny SD1.5 with SD2's differences, v-prediction (the 768 px
models'), linear projections and per-level head sizes in the UNet, OpenCLIP's exact GELU
and its "!" padding token."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from core.models.tiny.unet import unet_parts


def ddim_v_scheduler() -> Any:
    from diffusers import DDIMScheduler

    return DDIMScheduler(beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear",
                         num_train_timesteps=1000, clip_sample=False,
                         set_alpha_to_one=False, steps_offset=1, prediction_type="v_prediction")


def build(out_dir: Path, seed: int = 0) -> None:
    """Write a tiny random SD2 as a diffusers folder."""
    from diffusers import StableDiffusionPipeline

    parts = unet_parts(out_dir, seed, ddim_v_scheduler,
                       unet_extra={"use_linear_projection": True, "attention_head_dim": (2, 4)},
                       clip_act="gelu", pad_token="!")
    pipe = StableDiffusionPipeline(**parts, safety_checker=None, feature_extractor=None,
                                   requires_safety_checker=False)
    pipe.save_pretrained(str(out_dir), safe_serialization=True)

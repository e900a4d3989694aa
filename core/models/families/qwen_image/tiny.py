"""Tiny random Qwen-Image: a QwenImageTransformer2DModel with one block, a Wan-style causal
3D AutoencoderKLQwenImage (16 latent channels, spatial scale 8 as the real one) with
calibrated per-channel latents_mean/latents_std, a one-layer Qwen2.5-VL text encoder with
the tiny Qwen tokenizer (core/models/tiny/qwen.py), and Qwen-Image's dynamically shifted
FlowMatchEulerDiscreteScheduler config."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from core.models.tiny.qwen import qwen_tokenizer, tiny_qwen_vl

DIM = 32  # Qwen2.5-VL width = joint_attention_dim
Z_DIM = 16  # latent channels, as the real VAE
# Qwen/Qwen-Image scheduler/scheduler_config.json (see core/models/families/qwen_image/full_size).
SCHEDULER = {"num_train_timesteps": 1000, "shift": 1.0, "use_dynamic_shifting": True,
             "base_shift": 0.5, "max_shift": 0.9, "base_image_seq_len": 256,
             "max_image_seq_len": 8192, "shift_terminal": 0.02,
             "time_shift_type": "exponential"}


def tiny_qwen_vae(seed: int) -> Any:
    """Four levels (scale 8) with two temporal downsamplings, as the real VAE; 8 wide."""
    import torch
    from diffusers import AutoencoderKLQwenImage

    torch.manual_seed(seed)
    return AutoencoderKLQwenImage(
        base_dim=8, z_dim=Z_DIM, dim_mult=[1, 2, 4, 4], num_res_blocks=1,
        temperal_downsample=[False, True, True],
        latents_mean=[0.0] * Z_DIM, latents_std=[1.0] * Z_DIM)


def calibrate_qwen_vae(vae: Any, seed: int = 0) -> None:
    """Set latents_mean/latents_std per channel from the VAE's latents of smooth synthetic
    images, as the real statistics were measured: with the defaults (0, 1) a random
    VAE's latents are tiny next to the noise (see tiny/vae.py's calibrate_tiny_vae)."""
    import torch
    import torch.nn.functional as F

    generator = torch.Generator().manual_seed(seed)
    coarse = torch.rand(8, 3, 4, 4, generator=generator) * 2 - 1
    pixels = F.interpolate(coarse, size=(64, 64), mode="bilinear", align_corners=False)
    with torch.no_grad():
        latents = vae.encode(pixels.unsqueeze(2)).latent_dist.mean  # [B, z, 1, h, w]
    per_channel = latents.transpose(0, 1).reshape(Z_DIM, -1)
    vae.register_to_config(
        latents_mean=[round(float(v), 4) for v in per_channel.mean(dim=1)],
        latents_std=[round(float(v), 4) for v in per_channel.std(dim=1)])


def build(out_dir: Path, seed: int = 0) -> None:
    """Write a tiny random Qwen-Image-shaped model as a diffusers folder."""
    import torch
    from diffusers import (
        FlowMatchEulerDiscreteScheduler,
        QwenImagePipeline,
        QwenImageTransformer2DModel,
    )

    out_dir = Path(out_dir)
    torch.manual_seed(seed)
    transformer = QwenImageTransformer2DModel(
        patch_size=2, in_channels=4 * Z_DIM, out_channels=Z_DIM, num_layers=1,
        attention_head_dim=16, num_attention_heads=2, joint_attention_dim=DIM,
        guidance_embeds=False, axes_dims_rope=(4, 6, 6))
    vae = tiny_qwen_vae(seed + 1)
    calibrate_qwen_vae(vae, seed)
    tokenizer = qwen_tokenizer(out_dir / "tokenizer")
    pipe = QwenImagePipeline(
        transformer=transformer, vae=vae, scheduler=FlowMatchEulerDiscreteScheduler(**SCHEDULER),
        text_encoder=tiny_qwen_vl(tokenizer, DIM, seed + 2), tokenizer=tokenizer)
    pipe.save_pretrained(str(out_dir), safe_serialization=True)

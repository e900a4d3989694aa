"""A tiny Wan-style causal 3D VAE (AutoencoderKLWan and AutoencoderKLQwenImage, the same
architecture under two names): four levels, spatial scale 8 and two temporal
downsamplings (4x in time, so F frames give 1 + (F - 1) / 4 latent frames), as the real
VAEs, 8 wide. `tiny_wan22_vae`: Wan 2.2's 48-channel residual VAE (2x2 pixel patches,
16x in space), for tiny:wan_ti2v."""

from __future__ import annotations

from typing import Any

Z_DIM = 16  # latent channels, as the real VAEs


def tiny_causal_vae(class_name: str, seed: int) -> Any:
    """An untrained `diffusers.<class_name>` with latents_mean 0 and latents_std 1 (see
    `calibrate_causal_vae`)."""
    import diffusers
    import torch

    torch.manual_seed(seed)
    return getattr(diffusers, class_name)(
        base_dim=8, z_dim=Z_DIM, dim_mult=[1, 2, 4, 4], num_res_blocks=1,
        temperal_downsample=[False, True, True],
        latents_mean=[0.0] * Z_DIM, latents_std=[1.0] * Z_DIM)


def calibrate_causal_vae(vae: Any, seed: int = 0) -> None:
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


WAN22_Z_DIM = 48  # Wan 2.2's VAE (TI2V-5B): 48 latent channels
WAN22_PATCH = 2  # it folds 2x2 pixels into channels before its 8x encoder: 16x in space


def tiny_wan22_vae(seed: int) -> Any:
    """An untrained AutoencoderKLWan shaped as Wan 2.2's (Wan-AI/Wan2.2-TI2V-5B): residual
    blocks, 2x2 pixel patches (12 input/output channels), 48 latent channels, 16x in space
    and 4x in time, at tiny:wan's width (8; the real one is 160 wide, its decoder 256),
    latents_mean 0 and latents_std 1 (see `calibrate_causal_vae_channels`)."""
    import diffusers
    import torch

    torch.manual_seed(seed)
    return diffusers.AutoencoderKLWan(
        base_dim=8, z_dim=WAN22_Z_DIM, dim_mult=[1, 2, 4, 4], num_res_blocks=1,
        temperal_downsample=[False, True, True], is_residual=True,
        in_channels=3 * WAN22_PATCH ** 2, out_channels=3 * WAN22_PATCH ** 2,
        patch_size=WAN22_PATCH, scale_factor_temporal=4, scale_factor_spatial=16,
        latents_mean=[0.0] * WAN22_Z_DIM, latents_std=[1.0] * WAN22_Z_DIM)


def calibrate_causal_vae_channels(vae: Any, seed: int = 0) -> None:
    """`calibrate_causal_vae` for a VAE of any latent width (its config's z_dim): the
    per-channel latents_mean/latents_std of smooth synthetic images. A separate function
    so that tiny:wan's and tiny:qwen_image's statistics, and so their built folders, stay
    exactly as they are."""
    import torch
    import torch.nn.functional as F

    generator = torch.Generator().manual_seed(seed)
    coarse = torch.rand(8, 3, 4, 4, generator=generator) * 2 - 1
    pixels = F.interpolate(coarse, size=(64, 64), mode="bilinear", align_corners=False)
    with torch.no_grad():
        latents = vae.encode(pixels.unsqueeze(2)).latent_dist.mean  # [B, z, 1, h, w]
    per_channel = latents.transpose(0, 1).reshape(vae.config.z_dim, -1)
    vae.register_to_config(
        latents_mean=[round(float(v), 4) for v in per_channel.mean(dim=1)],
        latents_std=[round(float(v), 4) for v in per_channel.std(dim=1)])

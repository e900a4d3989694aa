"""Tiny VAEs: AutoencoderKL with 4 blocks (spatial scale factor 8), calibrated so their
latents have the spread real VAEs' normalisation gives."""

from __future__ import annotations

from typing import Any


def tiny_vae(latent_channels: int, scaling_factor: float, shift_factor: float | None = None,
             quant_convs: bool = True, norm_groups: int = 8) -> Any:
    """SD1.5/SD2/SDXL's shape: 4 latent channels, quant convs, no shift; SD3's/Flux's:
    16 channels, no quant convs, a shift. With 8 norm groups the first block's group
    norm is per channel, which erases absolute colour: a trained one uses fewer."""
    from diffusers import AutoencoderKL

    return AutoencoderKL(
        in_channels=3, out_channels=3, latent_channels=latent_channels,
        down_block_types=("DownEncoderBlock2D",) * 4, up_block_types=("UpDecoderBlock2D",) * 4,
        block_out_channels=(8, 16, 32, 32), layers_per_block=1, norm_num_groups=norm_groups,
        sample_size=128, scaling_factor=scaling_factor, shift_factor=shift_factor,
        use_quant_conv=quant_convs, use_post_quant_conv=quant_convs,
    )


def calibrate_tiny_vae(vae: Any, seed: int = 0, with_shift: bool = False) -> None:
    """Set a random VAE's latent normalisation as real ones are set: from the statistics
    of its latents on images (here smooth synthetic ones, made deterministically).

    Without this a random tiny VAE's latents have a std near 0.04, so noise drowns the
    image at every timestep and a demo cannot learn anything visible.
    """
    import torch
    import torch.nn.functional as F

    generator = torch.Generator().manual_seed(seed)
    coarse = torch.rand(8, 3, 4, 4, generator=generator) * 2 - 1
    pixels = F.interpolate(coarse, size=(64, 64), mode="bilinear", align_corners=False)
    with torch.no_grad():
        latents = vae.encode(pixels).latent_dist.mean
    shift = float(latents.mean()) if with_shift else None
    centred = latents - (shift or 0.0)
    vae.register_to_config(scaling_factor=round(1.0 / float(centred.std()), 4),
                           shift_factor=round(shift, 4) if with_shift else None)

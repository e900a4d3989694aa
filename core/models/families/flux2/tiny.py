"""Tiny random FLUX.2-klein (base, undistilled): a Flux2Transformer2DModel with one double
and one single block and no guidance embeddings (klein's `guidance_embeds=False`), an
AutoencoderKLFlux2 whose batch-norm statistics are calibrated, a tiny Qwen3 (tiny/qwen3.py)
and FLUX.2's dynamically shifted scheduler.

The VAE has 8 latent channels (the real one 32), so the patchified latents the
transformer sees have 32 channels (real: 128); the transformer's joint_attention_dim is
3 x the Qwen3 width, as the pipeline stacks three hidden layers.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from core.models.tiny.qwen3 import qwen_tokenizer, tiny_qwen3

LATENT_CHANNELS = 8
TEXT_LAYERS = 3  # the pipeline stacks hidden states (9, 18, 27)
QWEN_LAYERS = 28  # so layer 27 exists and is intermediate, as in the real 36-layer Qwen3
QWEN_HIDDEN = 16


def tiny_flux2_vae(seed: int) -> Any:
    """A 4-level (scale 8) AutoencoderKLFlux2 with calibrated batch-norm statistics."""
    import torch
    from diffusers import AutoencoderKLFlux2

    torch.manual_seed(seed)
    vae = AutoencoderKLFlux2(
        in_channels=3, out_channels=3, latent_channels=LATENT_CHANNELS,
        down_block_types=("DownEncoderBlock2D",) * 4, up_block_types=("UpDecoderBlock2D",) * 4,
        block_out_channels=(8, 16, 32, 32), layers_per_block=1, norm_num_groups=8,
        sample_size=128)
    calibrate_bn(vae, seed)
    return vae.eval()


def calibrate_bn(vae: Any, seed: int = 0) -> None:
    """Set the VAE's batch-norm running statistics as the real ones were set: from its
    patchified latents over images (here smooth synthetic ones). A random VAE's latents
    have a tiny spread; unnormalised, noise would drown them at every timestep."""
    import torch
    import torch.nn.functional as F
    from diffusers import Flux2KleinPipeline

    generator = torch.Generator().manual_seed(seed)
    coarse = torch.rand(8, 3, 4, 4, generator=generator) * 2 - 1
    pixels = F.interpolate(coarse, size=(64, 64), mode="bilinear", align_corners=False)
    with torch.no_grad():
        latents = Flux2KleinPipeline._patchify_latents(vae.encode(pixels).latent_dist.mode())
    vae.bn.running_mean.copy_(latents.mean(dim=(0, 2, 3)))
    vae.bn.running_var.copy_(latents.var(dim=(0, 2, 3)))


def build(out_dir: Path, seed: int = 0) -> None:
    """Write a tiny random FLUX.2-klein-shaped model as a diffusers folder."""
    import torch
    from diffusers import (
        FlowMatchEulerDiscreteScheduler,
        Flux2KleinPipeline,
        Flux2Transformer2DModel,
    )

    out_dir = Path(out_dir)
    torch.manual_seed(seed)
    transformer = Flux2Transformer2DModel(
        patch_size=1, in_channels=4 * LATENT_CHANNELS, num_layers=1, num_single_layers=1,
        attention_head_dim=16, num_attention_heads=2,
        joint_attention_dim=TEXT_LAYERS * QWEN_HIDDEN, axes_dims_rope=(4, 4, 4, 4),
        guidance_embeds=False)
    vae = tiny_flux2_vae(seed + 1)
    tokenizer = qwen_tokenizer(out_dir / "tokenizer")
    # FLUX.2's scheduler config (diffusers' convert_flux2_to_diffusers.py takes FLUX.1-dev's).
    scheduler = FlowMatchEulerDiscreteScheduler(
        num_train_timesteps=1000, shift=3.0, use_dynamic_shifting=True, base_shift=0.5,
        max_shift=1.15, base_image_seq_len=256, max_image_seq_len=4096)
    pipe = Flux2KleinPipeline(
        transformer=transformer, vae=vae, scheduler=scheduler,
        text_encoder=tiny_qwen3(len(tokenizer), QWEN_HIDDEN, QWEN_LAYERS, seed + 2,
                                causal_lm=True), tokenizer=tokenizer, is_distilled=False)
    pipe.save_pretrained(str(out_dir), safe_serialization=True)

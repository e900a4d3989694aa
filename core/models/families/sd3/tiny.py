"""Tiny random SD3: a 2-block SD3Transformer2DModel, a calibrated 16-channel VAE with a
shift, CLIP-L and CLIP-G with projections (16 and 32 wide) and a one-layer T5, each drawn
after its own seed."""

from __future__ import annotations

from pathlib import Path

from core.models.tiny.clip import clip_tokenizer, tiny_clip_config
from core.models.tiny.t5 import t5_tokenizer, tiny_t5_encoder
from core.models.tiny.vae import calibrate_tiny_vae, tiny_vae

# The real SD3 VAE's latent normalisation, before calibration.
VAE_SCALING = 1.5305
VAE_SHIFT = 0.0609
T5_DIM = 64  # = the transformer's joint_attention_dim


def build(out_dir: Path, seed: int = 0) -> None:
    """Write a tiny random SD3 (all three text encoders) as a diffusers folder."""
    import torch
    from diffusers import (
        FlowMatchEulerDiscreteScheduler,
        SD3Transformer2DModel,
        StableDiffusion3Pipeline,
    )
    from transformers import CLIPTextModelWithProjection

    out_dir = Path(out_dir)
    torch.manual_seed(seed)
    transformer = SD3Transformer2DModel(
        sample_size=32, patch_size=2, in_channels=16, out_channels=16, num_layers=2,
        attention_head_dim=8, num_attention_heads=4, caption_projection_dim=32,
        joint_attention_dim=T5_DIM, pooled_projection_dim=16 + 32, pos_embed_max_size=64)
    torch.manual_seed(seed + 1)
    vae = tiny_vae(16, VAE_SCALING, VAE_SHIFT, quant_convs=False)
    calibrate_tiny_vae(vae, seed, with_shift=True)
    torch.manual_seed(seed + 2)
    clip_l = CLIPTextModelWithProjection(tiny_clip_config(16, "quick_gelu", 16, 2))
    torch.manual_seed(seed + 3)
    clip_g = CLIPTextModelWithProjection(tiny_clip_config(32, "gelu", 32, 2))
    tokenizer_3, vocab_size = t5_tokenizer(out_dir / "tokenizer_3")
    pipe = StableDiffusion3Pipeline(
        transformer=transformer, vae=vae,
        scheduler=FlowMatchEulerDiscreteScheduler(num_train_timesteps=1000, shift=3.0),
        text_encoder=clip_l, tokenizer=clip_tokenizer(out_dir / "tokenizer"),
        text_encoder_2=clip_g, tokenizer_2=clip_tokenizer(out_dir / "tokenizer_2", "!"),
        text_encoder_3=tiny_t5_encoder(vocab_size, T5_DIM, seed + 4), tokenizer_3=tokenizer_3)
    pipe.save_pretrained(str(out_dir), safe_serialization=True)

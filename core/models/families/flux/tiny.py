"""Tiny random FLUX.1-dev: a FluxTransformer2DModel with one double and one single block
and guidance embeddings, a calibrated 16-channel VAE with a shift, CLIP-L (pooled) and a
one-layer T5, with FLUX.1's dynamically shifted schedule."""

from __future__ import annotations

from pathlib import Path

from core.models.tiny.clip import clip_tokenizer, tiny_clip_config
from core.models.tiny.t5 import t5_tokenizer, tiny_t5_encoder
from core.models.tiny.vae import calibrate_tiny_vae, tiny_vae

# The real FLUX.1 VAE's latent normalisation, before calibration.
VAE_SCALING = 0.3611
VAE_SHIFT = 0.1159
DIM = 32  # T5 width = joint_attention_dim = CLIP width = pooled_projection_dim


def build(out_dir: Path, seed: int = 0) -> None:
    """Write a tiny random FLUX.1-dev-shaped model as a diffusers folder."""
    import torch
    from diffusers import FlowMatchEulerDiscreteScheduler, FluxPipeline, FluxTransformer2DModel
    from transformers import CLIPTextModel

    out_dir = Path(out_dir)
    torch.manual_seed(seed)
    transformer = FluxTransformer2DModel(
        patch_size=1, in_channels=64, num_layers=1, num_single_layers=1,
        attention_head_dim=16, num_attention_heads=2, joint_attention_dim=DIM,
        pooled_projection_dim=DIM, guidance_embeds=True, axes_dims_rope=(4, 6, 6))
    torch.manual_seed(seed + 1)
    vae = tiny_vae(16, VAE_SCALING, VAE_SHIFT, quant_convs=False)
    calibrate_tiny_vae(vae, seed, with_shift=True)
    torch.manual_seed(seed + 2)
    clip = CLIPTextModel(tiny_clip_config(DIM, "quick_gelu", DIM, 2))
    tokenizer_2, vocab_size = t5_tokenizer(out_dir / "tokenizer_2")
    scheduler = FlowMatchEulerDiscreteScheduler(
        num_train_timesteps=1000, shift=3.0, use_dynamic_shifting=True, base_shift=0.5,
        max_shift=1.15, base_image_seq_len=256, max_image_seq_len=4096)
    pipe = FluxPipeline(
        transformer=transformer, vae=vae, scheduler=scheduler, text_encoder=clip,
        tokenizer=clip_tokenizer(out_dir / "tokenizer"),
        text_encoder_2=tiny_t5_encoder(vocab_size, DIM, seed + 3), tokenizer_2=tokenizer_2)
    pipe.save_pretrained(str(out_dir), safe_serialization=True)

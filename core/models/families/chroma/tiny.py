"""Tiny random Chroma: a ChromaTransformer2DModel with one double and one single block
and a one-layer approximator, a calibrated 16-channel VAE with a shift (FLUX.1's
normalisation, before calibration), a one-layer T5 and its offline tokenizer, with the
dynamically shifted schedule ChromaPipeline computes `mu` for."""

from __future__ import annotations

from pathlib import Path

from core.models.tiny.t5 import t5_tokenizer, tiny_t5_encoder
from core.models.tiny.vae import calibrate_tiny_vae, tiny_vae

# The real FLUX.1 VAE's latent normalisation (Chroma uses that VAE), before calibration.
VAE_SCALING = 0.3611
VAE_SHIFT = 0.1159
DIM = 32  # T5 width = joint_attention_dim


def build(out_dir: Path, seed: int = 0) -> None:
    """Write a tiny random Chroma1-HD-shaped model as a diffusers folder."""
    import torch
    from diffusers import ChromaPipeline, ChromaTransformer2DModel, FlowMatchEulerDiscreteScheduler

    out_dir = Path(out_dir)
    torch.manual_seed(seed)
    # approximator sizes as diffusers' own tiny Chroma (tests/pipelines/chroma): its input
    # is 4 * (approximator_num_channels // 4) wide.
    transformer = ChromaTransformer2DModel(
        patch_size=1, in_channels=64, num_layers=1, num_single_layers=1,
        attention_head_dim=16, num_attention_heads=2, joint_attention_dim=DIM,
        axes_dims_rope=(4, 6, 6), approximator_num_channels=16, approximator_hidden_dim=32,
        approximator_layers=1)
    torch.manual_seed(seed + 1)
    vae = tiny_vae(16, VAE_SCALING, VAE_SHIFT, quant_convs=False)
    calibrate_tiny_vae(vae, seed, with_shift=True)
    tokenizer, vocab_size = t5_tokenizer(out_dir / "tokenizer")
    scheduler = FlowMatchEulerDiscreteScheduler(
        num_train_timesteps=1000, shift=3.0, use_dynamic_shifting=True, base_shift=0.5,
        max_shift=1.15, base_image_seq_len=256, max_image_seq_len=4096)
    pipe = ChromaPipeline(
        transformer=transformer, vae=vae, scheduler=scheduler,
        text_encoder=tiny_t5_encoder(vocab_size, DIM, seed + 3), tokenizer=tokenizer)
    pipe.save_pretrained(str(out_dir), safe_serialization=True)

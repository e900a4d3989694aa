"""Tiny random Qwen-Image: a QwenImageTransformer2DModel with one block, a Wan-style causal
3D AutoencoderKLQwenImage (16 latent channels, spatial scale 8 as the real one) with
calibrated per-channel latents_mean/latents_std, a one-layer Qwen2.5-VL text encoder with
the tiny Qwen tokenizer (core/models/tiny/qwen.py), and Qwen-Image's dynamically shifted
FlowMatchEulerDiscreteScheduler config."""

from __future__ import annotations

from pathlib import Path

from core.models.tiny.causal_vae import Z_DIM, calibrate_causal_vae, tiny_causal_vae
from core.models.tiny.qwen import qwen_tokenizer, tiny_qwen_vl

DIM = 32  # Qwen2.5-VL width = joint_attention_dim
# Qwen/Qwen-Image scheduler/scheduler_config.json (see core/models/families/qwen_image/full_size).
SCHEDULER = {"num_train_timesteps": 1000, "shift": 1.0, "use_dynamic_shifting": True,
             "base_shift": 0.5, "max_shift": 0.9, "base_image_seq_len": 256,
             "max_image_seq_len": 8192, "shift_terminal": 0.02,
             "time_shift_type": "exponential"}


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
    vae = tiny_causal_vae("AutoencoderKLQwenImage", seed + 1)
    calibrate_causal_vae(vae, seed)
    tokenizer = qwen_tokenizer(out_dir / "tokenizer")
    pipe = QwenImagePipeline(
        transformer=transformer, vae=vae, scheduler=FlowMatchEulerDiscreteScheduler(**SCHEDULER),
        text_encoder=tiny_qwen_vl(tokenizer, DIM, seed + 2), tokenizer=tokenizer)
    pipe.save_pretrained(str(out_dir), safe_serialization=True)

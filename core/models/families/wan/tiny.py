"""Tiny random Wan 2.1 T2V: a WanTransformer3DModel with one block (patch 1x2x2 as the
real one), the causal 3D AutoencoderKLWan at the real scales (8x in space, 4x in time)
with calibrated latents_mean/latents_std, a one-layer UMT5 encoder with the offline T5
tokenizer, and Wan's UniPC flow scheduler with its shift of 3.0
(Wan-AI/Wan2.1-T2V-1.3B-Diffusers' scheduler_config.json, see full_size/)."""

from __future__ import annotations

from pathlib import Path

from core.models.tiny.causal_vae import Z_DIM, calibrate_causal_vae, tiny_causal_vae
from core.models.tiny.t5 import t5_tokenizer, tiny_t5_encoder

TEXT_DIM = 32  # UMT5 width = the transformer's text_dim
FLOW_SHIFT = 3.0


def scheduler_config() -> dict:
    """The parts of the real scheduler config that training and sampling read."""
    return {"num_train_timesteps": 1000, "prediction_type": "flow_prediction",
            "use_flow_sigmas": True, "flow_shift": FLOW_SHIFT, "solver_order": 2,
            "predict_x0": True, "solver_type": "bh2", "lower_order_final": True,
            "final_sigmas_type": "zero"}


def build(out_dir: Path, seed: int = 0) -> None:
    """Write a tiny random Wan-shaped model as a diffusers folder."""
    import torch
    from diffusers import UniPCMultistepScheduler, WanPipeline, WanTransformer3DModel

    out_dir = Path(out_dir)
    torch.manual_seed(seed)
    # head_dim 24: WanRotaryPosEmbed gives 8 of it to time and 8 to each spatial axis.
    transformer = WanTransformer3DModel(
        patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=24,
        in_channels=Z_DIM, out_channels=Z_DIM, text_dim=TEXT_DIM, freq_dim=32, ffn_dim=64,
        num_layers=1, cross_attn_norm=True, qk_norm="rms_norm_across_heads",
        rope_max_seq_len=1024)
    vae = tiny_causal_vae("AutoencoderKLWan", seed + 1)
    calibrate_causal_vae(vae, seed)
    tokenizer, vocab_size = t5_tokenizer(out_dir / "tokenizer")
    pipe = WanPipeline(
        tokenizer=tokenizer, text_encoder=tiny_t5_encoder(vocab_size, TEXT_DIM, seed + 2,
                                                          umt5=True),
        vae=vae, scheduler=UniPCMultistepScheduler(**scheduler_config()),
        transformer=transformer)
    pipe.save_pretrained(str(out_dir), safe_serialization=True)

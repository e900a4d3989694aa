"""Tiny random Z-Image: a ZImageTransformer2DModel with one main layer and one layer in
each refiner, a calibrated 16-channel VAE with a shift (FLUX.1's VAE, as Z-Image uses),
a two-layer Qwen3 text encoder with the tiny Qwen tokenizer, and Z-Image base's static
shift of 6.0 (Tongyi-MAI/Z-Image's scheduler_config.json; Turbo's is 3.0)."""

from __future__ import annotations

from pathlib import Path

from core.models.tiny.qwen3 import qwen_tokenizer, tiny_qwen3
from core.models.tiny.vae import calibrate_tiny_vae, tiny_vae

# The real VAE's latent normalisation (FLUX.1's), before calibration.
VAE_SCALING = 0.3611
VAE_SHIFT = 0.1159
TEXT_DIM = 32  # Qwen3 hidden size = the transformer's cap_feat_dim
TEXT_LAYERS = 2  # the pipeline takes hidden_states[-2]
SHIFT = 6.0


def build(out_dir: Path, seed: int = 0) -> None:
    """Write a tiny random Z-Image-shaped model as a diffusers folder."""
    import torch
    from diffusers import FlowMatchEulerDiscreteScheduler, ZImagePipeline, ZImageTransformer2DModel

    out_dir = Path(out_dir)
    torch.manual_seed(seed)
    # head_dim 16 = sum(axes_dims); axes_lens bound the RoPE positions: the first axis
    # counts caption tokens (up to the 512 the pipeline keeps, padded to 32), the others
    # latent patches (128 of them: 2048 px).
    transformer = ZImageTransformer2DModel(
        all_patch_size=(2,), all_f_patch_size=(1,), in_channels=16, dim=32, n_layers=1,
        n_refiner_layers=1, n_heads=2, n_kv_heads=2, norm_eps=1e-5, qk_norm=True,
        cap_feat_dim=TEXT_DIM, rope_theta=256.0, t_scale=1000.0, axes_dims=[8, 4, 4],
        axes_lens=[1024, 128, 128])
    with torch.no_grad():  # the real model's pad tokens are trained, not zero
        transformer.x_pad_token.normal_(std=0.5)
        transformer.cap_pad_token.normal_(std=0.5)
    torch.manual_seed(seed + 1)
    vae = tiny_vae(16, VAE_SCALING, VAE_SHIFT, quant_convs=False)
    calibrate_tiny_vae(vae, seed, with_shift=True)
    tokenizer = qwen_tokenizer(out_dir / "tokenizer")
    text_encoder = tiny_qwen3(len(tokenizer), TEXT_DIM, TEXT_LAYERS, seed + 2, causal_lm=False)
    scheduler = FlowMatchEulerDiscreteScheduler(num_train_timesteps=1000,
                                                use_dynamic_shifting=False, shift=SHIFT)
    pipe = ZImagePipeline(scheduler=scheduler, vae=vae, text_encoder=text_encoder,
                          tokenizer=tokenizer, transformer=transformer)
    pipe.save_pretrained(str(out_dir), safe_serialization=True)

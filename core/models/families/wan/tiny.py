"""Tiny random Wan 2.1 T2V: a WanTransformer3DModel with one block (patch 1x2x2 as the
real one), the causal 3D AutoencoderKLWan at the real scales (8x in space, 4x in time)
with calibrated latents_mean/latents_std, a one-layer UMT5 encoder with the offline T5
tokenizer, and Wan's UniPC flow scheduler with its shift of 3.0
(Wan-AI/Wan2.1-T2V-1.3B-Diffusers' scheduler_config.json, see full_size/).

`build_pipeline` with a second expert gives tiny:wan22 (the tiny22/ package): the same
parts plus `transformer_2` and a `boundary_ratio`, as Wan 2.2 A14B's folders hold. With
`i2v` it gives tiny:wan_i2v (tiny_i2v/): a WanImageToVideoPipeline whose transformer takes
36 channels (latents, mask, condition) and image embeds (`image_dim`, `added_kv_proj_dim`
as Wan 2.1 I2V's), with a two-layer CLIP vision encoder on 32-pixel images. With `ti2v` it
gives tiny:wan_ti2v (tiny_ti2v/): a Wan 2.2 TI2V-5B-shaped WanPipeline (`expand_timesteps`)
whose transformer takes and gives 48 channels, with Wan 2.2's residual 48-channel VAE
(16x in space, causal_vae.tiny_wan22_vae)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from core.models.tiny.causal_vae import (
    WAN22_Z_DIM,
    Z_DIM,
    calibrate_causal_vae,
    calibrate_causal_vae_channels,
    tiny_causal_vae,
    tiny_wan22_vae,
)
from core.models.tiny.t5 import t5_tokenizer, tiny_t5_encoder

TEXT_DIM = 32  # UMT5 width = the transformer's text_dim
FLOW_SHIFT = 3.0


def scheduler_config() -> dict:
    """The parts of the real scheduler config that training and sampling read."""
    return {"num_train_timesteps": 1000, "prediction_type": "flow_prediction",
            "use_flow_sigmas": True, "flow_shift": FLOW_SHIFT, "solver_order": 2,
            "predict_x0": True, "solver_type": "bh2", "lower_order_final": True,
            "final_sigmas_type": "zero"}


IMAGE_DIM = 32  # the tiny CLIP vision width = the I2V transformer's image_dim
IMAGE_SIZE = 32
I2V_CHANNELS = 2 * Z_DIM + 4  # noisy latents, mask, condition latents


def tiny_transformer(seed: int, i2v: bool = False, image: bool = False,
                     channels: int = Z_DIM) -> Any:
    """A one-block WanTransformer3DModel drawn from `seed` (the global torch RNG); `i2v`:
    an I2V model's 36 input channels; `image`: Wan 2.1 I2V's image cross-attention;
    `channels`: the latent channels it takes and gives (48 for TI2V-5B's VAE)."""
    import torch
    from diffusers import WanTransformer3DModel

    torch.manual_seed(seed)
    # head_dim 24: WanRotaryPosEmbed gives 8 of it to time and 8 to each spatial axis.
    embeds = {"image_dim": IMAGE_DIM, "added_kv_proj_dim": 2 * 24} if image else {}
    return WanTransformer3DModel(
        patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=24,
        in_channels=I2V_CHANNELS if i2v else channels, out_channels=channels, text_dim=TEXT_DIM,
        freq_dim=32, ffn_dim=64, num_layers=1, cross_attn_norm=True,
        qk_norm="rms_norm_across_heads", rope_max_seq_len=1024, **embeds)


def tiny_image_encoder(seed: int) -> tuple[Any, Any]:
    """A two-layer CLIPVisionModel (the pipeline reads its second-to-last hidden state)
    and a CLIPImageProcessor at IMAGE_SIZE, built offline from configs."""
    import torch
    from transformers import CLIPImageProcessor, CLIPVisionConfig, CLIPVisionModel

    torch.manual_seed(seed)
    config = CLIPVisionConfig(hidden_size=IMAGE_DIM, intermediate_size=64, num_hidden_layers=2,
                              num_attention_heads=2, image_size=IMAGE_SIZE, patch_size=8,
                              projection_dim=IMAGE_DIM)
    processor = CLIPImageProcessor(size={"shortest_edge": IMAGE_SIZE},
                                   crop_size={"height": IMAGE_SIZE, "width": IMAGE_SIZE})
    return CLIPVisionModel(config), processor


def build(out_dir: Path, seed: int = 0) -> None:
    """Write a tiny random Wan-shaped model as a diffusers folder."""
    build_pipeline(out_dir, seed)


def build_pipeline(out_dir: Path, seed: int, second_seed: int | None = None,
                   boundary_ratio: float | None = None, i2v: bool = False,
                   ti2v: bool = False) -> None:
    """The tiny Wan folder; with `second_seed`, a second expert (`transformer_2`, drawn
    from that seed, so the two differ) used below `boundary_ratio`. The first expert and
    every other part are drawn as tiny:wan's, from the same seeds. `i2v`: see the module
    docstring (the image encoder is drawn from seed + 4); with a second expert too, a Wan
    2.2 I2V A14B-shaped folder: no image encoder, no image_dim. `ti2v` (alone): a Wan 2.2
    TI2V-5B-shaped folder, the 48-channel VAE and transformer from tiny:wan's seeds."""
    import diffusers

    out_dir = Path(out_dir)
    embeds = i2v and second_seed is None  # only Wan 2.1 I2V has an image encoder
    if ti2v:
        transformer = tiny_transformer(seed, channels=WAN22_Z_DIM)
        vae = tiny_wan22_vae(seed + 1)
        calibrate_causal_vae_channels(vae, seed)
    else:
        transformer = tiny_transformer(seed, i2v, embeds)
        vae = tiny_causal_vae("AutoencoderKLWan", seed + 1)
        calibrate_causal_vae(vae, seed)
    tokenizer, vocab_size = t5_tokenizer(out_dir / "tokenizer")
    extra: dict[str, Any] = {}
    if second_seed is not None:
        extra = {"transformer_2": tiny_transformer(second_seed, i2v),
                 "boundary_ratio": boundary_ratio}
    pipeline = diffusers.WanPipeline
    if embeds:
        encoder, processor = tiny_image_encoder(seed + 4)
        extra.update(image_encoder=encoder, image_processor=processor)
    if i2v:
        pipeline = diffusers.WanImageToVideoPipeline
    if ti2v:  # what makes WanPipeline give per-token timesteps (family's ti2v.py)
        extra["expand_timesteps"] = True
    pipe = pipeline(
        tokenizer=tokenizer, text_encoder=tiny_t5_encoder(vocab_size, TEXT_DIM, seed + 2,
                                                          umt5=True),
        vae=vae, scheduler=diffusers.UniPCMultistepScheduler(**scheduler_config()),
        transformer=transformer, **extra)
    pipe.save_pretrained(str(out_dir), safe_serialization=True)

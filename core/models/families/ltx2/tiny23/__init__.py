"""`tiny:ltx23`: a tiny random LTX-2.3 (LTX2Pipeline), shaped as diffusers'
scripts/convert_ltx2_to_diffusers.py writes version "2.3" where the code paths differ
from tiny:ltx2 (../tiny.py, whose Gemma 3, tokenizer, audio VAE and scheduler it shares):

- connectors: per-modality projections of every Gemma layer (RMS-normalised, biased),
  straight to each stream's width (32 video, 16 audio), gated attention in both
  connectors;
- transformer: gated attention and prompt modulation (`cross_attn_mod`) in both streams,
  no caption projections (`use_prompt_embeddings` false), perturbable attention for STG;
- vae: the 2.3 decoder layout (four up blocks: spatiotemporal, spatiotemporal, temporal,
  spatial; no residual upsampling; zero padding), the same 32x / 8x compression;
- vocoder: LTX2VocoderWithBWE (the 16 kHz vocoder, then a bandwidth extender to 48 kHz).

Why a package with a weights.safetensors: as wan's tiny22/ explains, `trained_tiny`
names a package whose `build` the tiny machinery imports and whose weights.safetensors
it hashes into the built folder's marker. The model is random, so the file holds no
tensors; its metadata (`RECIPE`) names the version, and a changed recipe rebuilds every
copy.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from core.models.families.ltx2.tiny import (
    AUDIO_LATENT_CHANNELS,
    MEL_BINS,
    TEXT_DIM,
    TEXT_LAYERS,
    VIDEO_CHANNELS,
    write_pipeline,
)

WEIGHTS = Path(__file__).with_name("weights.safetensors")
RECIPE = {"version": "2.3"}
VIDEO_DIM, AUDIO_DIM = 32, 16  # each stream's width: heads x head dim


def write_recipe(path: Path = WEIGHTS) -> None:
    """The tensor-less weights.safetensors whose metadata is RECIPE."""
    from core.models.tiny.recipe import write_recipe as write

    write(path, RECIPE)


def connectors(seed: int) -> Any:
    import torch
    from diffusers.pipelines.ltx2 import LTX2TextConnectors

    torch.manual_seed(seed)
    return LTX2TextConnectors(
        caption_channels=TEXT_DIM, text_proj_in_factor=TEXT_LAYERS + 1,
        video_connector_num_attention_heads=2, video_connector_attention_head_dim=16,
        video_connector_num_layers=1, video_connector_num_learnable_registers=8,
        video_gated_attn=True, audio_connector_num_attention_heads=2,
        audio_connector_attention_head_dim=8, audio_connector_num_layers=1,
        audio_connector_num_learnable_registers=8, audio_gated_attn=True,
        connector_rope_base_seq_len=4096, rope_type="split", per_modality_projections=True,
        video_hidden_dim=VIDEO_DIM, audio_hidden_dim=AUDIO_DIM, proj_bias=True)


def transformer(seed: int) -> Any:
    import torch
    from diffusers import LTX2VideoTransformer3DModel

    torch.manual_seed(seed)
    audio = AUDIO_LATENT_CHANNELS * MEL_BINS // 4
    return LTX2VideoTransformer3DModel(
        in_channels=VIDEO_CHANNELS, out_channels=VIDEO_CHANNELS, num_attention_heads=2,
        attention_head_dim=16, cross_attention_dim=VIDEO_DIM, gated_attn=True,
        cross_attn_mod=True, audio_in_channels=audio, audio_out_channels=audio,
        audio_num_attention_heads=2, audio_attention_head_dim=8,
        audio_cross_attention_dim=AUDIO_DIM, audio_gated_attn=True,
        audio_cross_attn_mod=True, num_layers=1, caption_channels=TEXT_DIM,
        rope_type="split", use_prompt_embeddings=False, perturbed_attn=True)


def video_vae(seed: int) -> Any:
    import torch
    from diffusers import AutoencoderKLLTX2Video

    torch.manual_seed(seed)
    return AutoencoderKLLTX2Video(
        latent_channels=VIDEO_CHANNELS, block_out_channels=(8, 16, 32, 32),
        decoder_block_out_channels=(8, 16, 16, 32), layers_per_block=(1, 1, 1, 1, 1),
        decoder_layers_per_block=(1, 1, 1, 1, 1),
        decoder_spatio_temporal_scaling=(True, True, True, True),
        decoder_inject_noise=(False,) * 5,
        upsample_type=("spatiotemporal", "spatiotemporal", "temporal", "spatial"),
        upsample_residual=(False,) * 4, upsample_factor=(2, 2, 1, 2), decoder_causal=False,
        decoder_spatial_padding_mode="zeros", spatial_compression_ratio=32,
        temporal_compression_ratio=8)


def vocoder(seed: int) -> Any:
    import torch
    from diffusers.pipelines.ltx2 import LTX2VocoderWithBWE

    torch.manual_seed(seed)
    # the real upsampling factors: 160x (16 kHz at the mel hop), then 240x from the
    # extender's own mel (hop 80) to 48 kHz; widths small
    return LTX2VocoderWithBWE(
        in_channels=2 * MEL_BINS, hidden_channels=64,
        upsample_kernel_sizes=[11, 4, 4, 4, 4, 4], upsample_factors=[5, 2, 2, 2, 2, 2],
        resnet_kernel_sizes=[3], resnet_dilations=[[1]], bwe_in_channels=2 * MEL_BINS,
        bwe_hidden_channels=32, bwe_upsample_kernel_sizes=[12, 11, 4, 4, 4],
        bwe_upsample_factors=[6, 5, 2, 2, 2], bwe_resnet_kernel_sizes=[3],
        bwe_resnet_dilations=[[1]], num_mel_channels=MEL_BINS)


def build(out_dir: Path, seed: int = 0) -> None:
    """Write tiny:ltx23 as a diffusers folder (LTX2Pipeline)."""
    write_pipeline(out_dir, seed, vae=video_vae(seed + 1), connectors=connectors(seed + 4),
                   transformer=transformer(seed), vocoder=vocoder(seed + 5))

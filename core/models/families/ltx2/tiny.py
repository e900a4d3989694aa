"""Tiny random LTX-2: every part LTX2Pipeline loads, from diffusers' and transformers'
own classes at tiny widths, written as a diffusers folder offline (`tiny:ltx2`).

- transformer: LTX2VideoTransformer3DModel, one block, 128 video latent channels (the
  real VAE's) and 16 audio ones (4 latent channels x 4 latent mel bins, packed as the
  pipeline packs them), the real VAE factors (8 in time, 32 in space) for its RoPE;
- vae: AutoencoderKLLTX2Video at the real compression (patch 4, three spatial and three
  temporal halvings: 32x in space, 8x in time, so F = 8k + 1 frames give k + 1 latent
  frames), 128 latent channels, latents_mean/std measured on smooth clips;
- audio_vae: AutoencoderKLLTX2Audio on 16 mel bins at the real 16 kHz and hop of 160
  (100 mel frames a second, 4x fewer latents), statistics measured on noise;
- vocoder: LTX2Vocoder (mel -> 24 kHz stereo waveform, the real upsampling factors);
- connectors: LTX2TextConnectors (LTX-2.0's: one projection of every Gemma layer, then a
  connector per modality with learnable registers that fill the padding);
- text_encoder: Gemma3ForConditionalGeneration (two text layers and a one-layer vision
  tower, which text-only prompts never run) with a Gemma tokenizer over a character
  vocabulary (left padding, <bos> first, as Gemma's);
- scheduler: FlowMatchEulerDiscreteScheduler with LTX-2's dynamic shift (base 0.95, max
  2.05 over 1024..4096 tokens, terminal 0.1), as diffusers' conversion script writes it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from core.models.tiny.t5 import t5_vocab

TEXT_DIM = 32  # Gemma hidden size = the connectors' caption_channels
TEXT_LAYERS = 2  # Gemma text layers: the connectors read the embeddings and each layer
VIDEO_CHANNELS = 128
AUDIO_LATENT_CHANNELS = 4
MEL_BINS = 16
MAX_LENGTH = 1024  # the tokenizer's model_max_length and the pipeline's text length


def scheduler_config() -> dict[str, Any]:
    """LTX-2's scheduler (diffusers' scripts/convert_ltx2_to_diffusers.py)."""
    return {"use_dynamic_shifting": True, "base_shift": 0.95, "max_shift": 2.05,
            "base_image_seq_len": 1024, "max_image_seq_len": 4096, "shift_terminal": 0.1}


def gemma_tokenizer(out_dir: Path) -> Any:
    """A GemmaTokenizer over single characters (t5.py's vocabulary behind Gemma's pad,
    eos, bos and unk), adding <bos> first as Gemma's does; saved and loaded back."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from tokenizers.processors import TemplateProcessing
    from transformers import GemmaTokenizer

    specials = [("<pad>", 0.0), ("<eos>", 0.0), ("<bos>", 0.0), ("<unk>", 0.0)]
    vocab = specials + t5_vocab()[3:]  # t5_vocab's own three specials left out
    backend = Tokenizer(models.Unigram(vocab, unk_id=3, byte_fallback=False))
    backend.pre_tokenizer = pre_tokenizers.Metaspace()
    backend.post_processor = TemplateProcessing(single="<bos> $A", pair="<bos> $A $B",
                                                special_tokens=[("<bos>", 2)])
    tok = GemmaTokenizer(tokenizer_object=backend, bos_token="<bos>", eos_token="<eos>",
                         pad_token="<pad>", unk_token="<unk>", model_max_length=MAX_LENGTH,
                         padding_side="left")
    out_dir.mkdir(parents=True, exist_ok=True)
    tok.save_pretrained(str(out_dir))
    return GemmaTokenizer.from_pretrained(str(out_dir), local_files_only=True)


def tiny_gemma(vocab_size: int, seed: int) -> Any:
    import torch
    from transformers import (
        Gemma3Config,
        Gemma3ForConditionalGeneration,
        Gemma3TextConfig,
        SiglipVisionConfig,
    )

    torch.manual_seed(seed)
    text = Gemma3TextConfig(vocab_size=vocab_size, hidden_size=TEXT_DIM, intermediate_size=64,
                            num_hidden_layers=TEXT_LAYERS, num_attention_heads=2,
                            num_key_value_heads=1, head_dim=16, sliding_window=64,
                            max_position_embeddings=MAX_LENGTH)
    vision = SiglipVisionConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                num_attention_heads=2, image_size=28, patch_size=14)
    # image token ids inside the tiny vocabulary (prompts here never hold them)
    config = Gemma3Config(text_config=text, vision_config=vision, mm_tokens_per_image=4,
                          boi_token_index=1, eoi_token_index=1, image_token_index=3)
    return Gemma3ForConditionalGeneration(config)


def tiny_connectors(seed: int) -> Any:
    import torch
    from diffusers.pipelines.ltx2 import LTX2TextConnectors

    torch.manual_seed(seed)
    per_modality = {f"{m}_connector_{k}": v for m in ("video", "audio") for k, v in
                    (("num_attention_heads", 2), ("attention_head_dim", 16),
                     ("num_layers", 1), ("num_learnable_registers", 8))}
    return LTX2TextConnectors(caption_channels=TEXT_DIM, text_proj_in_factor=TEXT_LAYERS + 1,
                              connector_rope_base_seq_len=4096, rope_type="split",
                              **per_modality)


def tiny_transformer(seed: int) -> Any:
    import torch
    from diffusers import LTX2VideoTransformer3DModel

    torch.manual_seed(seed)
    audio = AUDIO_LATENT_CHANNELS * MEL_BINS // 4
    # cross_attention_dim is each stream's own width (heads x head dim), as in the real one
    return LTX2VideoTransformer3DModel(
        in_channels=VIDEO_CHANNELS, out_channels=VIDEO_CHANNELS, num_attention_heads=2,
        attention_head_dim=16, cross_attention_dim=32, audio_in_channels=audio,
        audio_out_channels=audio, audio_num_attention_heads=2, audio_attention_head_dim=8,
        audio_cross_attention_dim=16, num_layers=1, caption_channels=TEXT_DIM,
        rope_type="split")


def tiny_video_vae(seed: int) -> Any:
    import torch
    from diffusers import AutoencoderKLLTX2Video

    torch.manual_seed(seed)
    return AutoencoderKLLTX2Video(
        latent_channels=VIDEO_CHANNELS, block_out_channels=(8, 16, 32, 64),
        decoder_block_out_channels=(8, 16, 32), layers_per_block=(1, 1, 1, 1, 1),
        decoder_layers_per_block=(1, 1, 1, 1), decoder_causal=False,
        spatial_compression_ratio=32, temporal_compression_ratio=8)


def tiny_audio_vae(seed: int) -> Any:
    import torch
    from diffusers import AutoencoderKLLTX2Audio

    torch.manual_seed(seed)
    # base_channels sizes latents_mean/std, which normalise the packed [C x mel/4] features
    return AutoencoderKLLTX2Audio(base_channels=AUDIO_LATENT_CHANNELS * MEL_BINS // 4,
                                  ch_mult=(1, 2, 4), num_res_blocks=1,
                                  latent_channels=AUDIO_LATENT_CHANNELS, mel_bins=MEL_BINS)


def tiny_vocoder(seed: int) -> Any:
    import torch
    from diffusers.pipelines.ltx2 import LTX2Vocoder

    torch.manual_seed(seed)
    # the widths halve at each of the five upsamplings, so 64 ends at 2
    return LTX2Vocoder(in_channels=2 * MEL_BINS, hidden_channels=64,
                       upsample_kernel_sizes=[12, 10, 4, 4, 4], upsample_factors=[6, 5, 2, 2, 2],
                       resnet_kernel_sizes=[3], resnet_dilations=[[1]])


def calibrate(vae: Any, audio_vae: Any, seed: int) -> None:
    """latents_mean/std of both VAEs measured on smooth clips and on noise mel frames, as
    the real statistics were measured on data: with the defaults (0, 1) a random VAE's
    latents are tiny next to the noise."""
    import torch
    import torch.nn.functional as F

    from core.models.families.ltx2.audio import pack_audio

    generator = torch.Generator().manual_seed(seed)
    coarse = torch.rand(4, 3, 9, 2, 2, generator=generator) * 2 - 1
    clips = F.interpolate(coarse, size=(9, 64, 64), mode="trilinear", align_corners=False)
    mel = torch.randn(4, 2, 101, MEL_BINS, generator=generator)
    with torch.no_grad():
        video = vae.encode(clips).latent_dist.mode().transpose(0, 1).flatten(1)
        audio = pack_audio(audio_vae.encode(mel).latent_dist.mode()).flatten(0, 1)
    vae.latents_mean.copy_(video.mean(dim=1))
    vae.latents_std.copy_(video.std(dim=1))
    audio_vae.latents_mean.copy_(audio.mean(dim=0))
    audio_vae.latents_std.copy_(audio.std(dim=0))


def build(out_dir: Path, seed: int = 0) -> None:
    """Write a tiny random LTX-2 as a diffusers folder."""
    write_pipeline(out_dir, seed, vae=tiny_video_vae(seed + 1),
                   connectors=tiny_connectors(seed + 4), transformer=tiny_transformer(seed),
                   vocoder=tiny_vocoder(seed + 5))


def write_pipeline(out_dir: Path, seed: int, *, vae: Any, connectors: Any, transformer: Any,
                   vocoder: Any) -> None:
    """An LTX2Pipeline folder of the given parts with the tiny Gemma, its tokenizer, the
    audio VAE and the scheduler above (tiny:ltx2's, and tiny:ltx23's, tiny23/)."""
    from diffusers import FlowMatchEulerDiscreteScheduler, LTX2Pipeline

    out_dir = Path(out_dir)
    tokenizer = gemma_tokenizer(out_dir / "tokenizer")
    audio_vae = tiny_audio_vae(seed + 3)
    calibrate(vae, audio_vae, seed)
    pipe = LTX2Pipeline(
        scheduler=FlowMatchEulerDiscreteScheduler(**scheduler_config()), vae=vae,
        audio_vae=audio_vae, text_encoder=tiny_gemma(len(tokenizer), seed + 2),
        tokenizer=tokenizer, connectors=connectors, transformer=transformer, vocoder=vocoder)
    pipe.save_pretrained(str(out_dir), safe_serialization=True)

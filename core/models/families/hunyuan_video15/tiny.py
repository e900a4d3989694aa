"""Tiny random HunyuanVideo 1.5 T2V (tiny:hunyuan_video15), built offline from configs:
a one-block HunyuanVideo15Transformer3DModel (65 input channels: latents, condition
latents, mask; 32 out, patch 1, as the real one), AutoencoderKLHunyuanVideo15 at the real
scales (32 latent channels, 16x in space, 4x in time) at tiny width, a three-layer
Qwen2_5_VLTextModel with the tiny Qwen tokenizer built for this pipeline's template (its
system part is 108 tokens, the pipeline's `prompt_template_encode_start_idx`, which it
drops), ByT5Tokenizer (byte-level, no files to fetch) with a one-layer T5 encoder of
ByT5's vocabulary, FlowMatchEulerDiscreteScheduler with shift 5.0 and the
ClassifierFreeGuidance guider at 6.0 (the 480p T2V model's, see full_size/)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

SHIFT = 5.0  # hunyuanvideo-community/HunyuanVideo-1.5-Diffusers-480p_t2v's scheduler
GUIDANCE = 6.0  # and its guider
LATENT_CHANNELS = 32
TEXT_DIM = 32  # tiny Qwen width = the transformer's text_embed_dim
GLYPH_DIM = 32  # tiny ByT5 width = text_embed_2_dim
IMAGE_DIM = 16  # image_embed_dim (SigLIP's width in the real model)
BYT5_VOCAB = 384  # ByT5Tokenizer: 3 specials, 256 bytes, 125 extra ids
# HunyuanVideo15Pipeline's system message, up to the user's text: the part it drops.
TEMPLATE_DROP = 108


def template_prefix() -> str:
    """The chat template's system part as the pipeline builds it (its own system message,
    read from diffusers so the tiny tokenizer follows it)."""
    from diffusers import HunyuanVideo15Pipeline

    system = next(d for d in HunyuanVideo15Pipeline._get_mllm_prompt_embeds.__defaults__
                  if isinstance(d, str))
    return f"<|im_start|>system\n{system}<|im_end|>\n<|im_start|>user\n"


def tiny_text_encoders(out_dir: Path, seed: int) -> dict[str, Any]:
    """tokenizer/text_encoder (Qwen2.5-VL's text model) and tokenizer_2/text_encoder_2
    (ByT5), random from `seed`."""
    import torch
    from transformers import ByT5Tokenizer, Qwen2_5_VLTextModel, T5Config, T5EncoderModel

    from core.models.tiny.qwen import TEMPLATE_SUFFIX, qwen_tokenizer, tiny_qwen_vl

    tokenizer = qwen_tokenizer(out_dir / "tokenizer", template_prefix(), TEMPLATE_SUFFIX,
                               TEMPLATE_DROP)
    tokenizer.padding_side = "right"  # as the real tokenizer is loaded (diffusers' converter)
    # hidden_states[-3] is what the pipeline reads: three layers make it a layer's output.
    qwen = tiny_qwen_vl(tokenizer, TEXT_DIM, seed, layers=3)
    text_encoder = Qwen2_5_VLTextModel(qwen.config.text_config)
    text_encoder.load_state_dict(qwen.model.language_model.state_dict())
    torch.manual_seed(seed + 1)
    byt5 = T5EncoderModel(T5Config(
        vocab_size=BYT5_VOCAB, d_model=GLYPH_DIM, d_kv=8, d_ff=2 * GLYPH_DIM, num_layers=1,
        num_heads=2, relative_attention_num_buckets=8, relative_attention_max_distance=32,
        dropout_rate=0.0, feed_forward_proj="gated-gelu", is_encoder_decoder=False,
        use_cache=False, pad_token_id=0, eos_token_id=1)).eval()
    return {"tokenizer": tokenizer, "text_encoder": text_encoder.eval(),
            "tokenizer_2": ByT5Tokenizer(), "text_encoder_2": byt5}


def tiny_transformer(seed: int, task: str = "t2v") -> Any:
    """A one-block HunyuanVideo15Transformer3DModel (head_dim 16 = rope axes 4 + 6 + 6)."""
    import torch
    from diffusers import HunyuanVideo15Transformer3DModel

    torch.manual_seed(seed)
    return HunyuanVideo15Transformer3DModel(
        in_channels=2 * LATENT_CHANNELS + 1, out_channels=LATENT_CHANNELS,
        num_attention_heads=2, attention_head_dim=16, num_layers=1, num_refiner_layers=1,
        mlp_ratio=2.0, text_embed_dim=TEXT_DIM, text_embed_2_dim=GLYPH_DIM,
        image_embed_dim=IMAGE_DIM, rope_axes_dim=(4, 6, 6), target_size=64, task_type=task)


def tiny_vae(seed: int) -> Any:
    """The real VAE's scales at tiny width: five levels (four 2x steps in space, two in
    time), the last 64 wide (the encoder's shortcut averages it down to 2 x 32 channels)."""
    import torch
    from diffusers import AutoencoderKLHunyuanVideo15

    torch.manual_seed(seed)
    return AutoencoderKLHunyuanVideo15(latent_channels=LATENT_CHANNELS, layers_per_block=1,
                                       block_out_channels=(8, 8, 16, 32, 64))


def build(out_dir: Path, seed: int = 0) -> None:
    """Write tiny:hunyuan_video15 as a diffusers folder (HunyuanVideo15Pipeline)."""
    build_pipeline(out_dir, seed)


def build_pipeline(out_dir: Path, seed: int, extra: dict[str, Any] | None = None,
                   pipeline: str = "HunyuanVideo15Pipeline", task: str = "t2v") -> None:
    """The tiny folder of `pipeline` with `extra` components (image-to-video: the image
    encoder and its processor), every shared part drawn from the same seeds."""
    import diffusers
    from diffusers.guiders import ClassifierFreeGuidance

    out_dir = Path(out_dir)
    pipe = getattr(diffusers, pipeline)(
        transformer=tiny_transformer(seed, task), vae=tiny_vae(seed + 1),
        scheduler=diffusers.FlowMatchEulerDiscreteScheduler(shift=SHIFT),
        guider=ClassifierFreeGuidance(guidance_scale=GUIDANCE),
        **tiny_text_encoders(out_dir, seed + 2), **(extra or {}))
    pipe.save_pretrained(str(out_dir), safe_serialization=True)

"""Tiny random Ideogram 4: two Ideogram4Transformer2DModel (the conditional `transformer`
and the `unconditional_transformer`, each two blocks), the tiny calibrated
AutoencoderKLFlux2 of tiny:flux2 (8 latent channels, so 32 packed channels: real 32 and
128), a Qwen3VLModel text encoder 36 layers deep (the pipeline taps hidden states of
layers 0, 3, ..., 33, 35: QWEN3_VL_ACTIVATION_LAYERS) and 16 wide, so the transformer's
llm_features_dim is 13 x 16, and the tiny Qwen tokenizer with a Qwen3-VL-style chat
template (message content as a list of {"type": "text"} parts, as the pipeline passes it).

The batch-norm statistics are recalibrated in Ideogram 4's packed channel order (patch
row, patch column, VAE channel: train_dreambooth_lora_ideogram4.py's patchify_latents),
which differs from FLUX.2's (channel first).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from core.models.families.flux2.tiny import tiny_flux2_vae

TEXT_HIDDEN = 16
TEXT_LAYERS = 36  # the tapped layers go up to 35
TAPPED = 13  # len(QWEN3_VL_ACTIVATION_LAYERS)

CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' }}"
    "{%- if message['content'] is string %}{{- message['content'] }}"
    "{%- else %}{%- for part in message['content'] %}"
    "{%- if part['type'] == 'text' %}{{- part['text'] }}{%- endif %}"
    "{%- endfor %}{%- endif %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


def vl_tokenizer(out_dir: Path) -> Any:
    """The tiny Qwen tokenizer (core/models/tiny/qwen3.py) with the Qwen3-VL template."""
    from transformers import Qwen2TokenizerFast

    from core.models.tiny.qwen3 import qwen_tokenizer

    tok = qwen_tokenizer(out_dir)
    tok.chat_template = CHAT_TEMPLATE
    tok.save_pretrained(str(out_dir))
    return Qwen2TokenizerFast.from_pretrained(str(out_dir), local_files_only=True)


def tiny_text_encoder(vocab_size: int, seed: int) -> Any:
    """A Qwen3VLModel (the pipeline reads `.language_model`) with a one-block vision tower."""
    import torch
    from transformers import Qwen3VLConfig, Qwen3VLModel

    from core.models.tiny.qwen3 import PAD_TOKEN, qwen_vocab

    vocab = qwen_vocab()
    text = dict(vocab_size=vocab_size, hidden_size=TEXT_HIDDEN, intermediate_size=32,
                num_hidden_layers=TEXT_LAYERS, num_attention_heads=2, num_key_value_heads=1,
                head_dim=8, max_position_embeddings=4096, rms_norm_eps=1e-6,
                rope_theta=5_000_000.0, rope_scaling={"rope_type": "default",
                                                      "mrope_section": [2, 1, 1],
                                                      "mrope_interleaved": True},
                pad_token_id=vocab[PAD_TOKEN], use_cache=False)
    vision = dict(depth=1, hidden_size=16, intermediate_size=32, num_heads=2,
                  out_hidden_size=TEXT_HIDDEN, patch_size=16, spatial_merge_size=2,
                  temporal_patch_size=2, num_position_embeddings=16,
                  deepstack_visual_indexes=[0])
    config = Qwen3VLConfig(text_config=text, vision_config=vision)
    torch.manual_seed(seed)
    return Qwen3VLModel(config).eval()


def calibrate_packed_bn(vae: Any, seed: int = 0) -> None:
    """The VAE's batch-norm statistics over Ideogram 4's packed latents (see above)."""
    import torch
    import torch.nn.functional as F

    from core.models.families.ideogram4.text import patchify

    generator = torch.Generator().manual_seed(seed)
    coarse = torch.rand(8, 3, 4, 4, generator=generator) * 2 - 1
    pixels = F.interpolate(coarse, size=(64, 64), mode="bilinear", align_corners=False)
    with torch.no_grad():
        packed = patchify(vae.encode(pixels).latent_dist.mode())
    vae.bn.running_mean.copy_(packed.mean(dim=(0, 2, 3)))
    vae.bn.running_var.copy_(packed.var(dim=(0, 2, 3)))


def tiny_transformer(in_channels: int) -> Any:
    from diffusers import Ideogram4Transformer2DModel

    return Ideogram4Transformer2DModel(
        in_channels=in_channels, num_layers=2, attention_head_dim=12, num_attention_heads=2,
        intermediate_size=32, adaln_dim=16, llm_features_dim=TAPPED * TEXT_HIDDEN,
        rope_theta=5_000_000, mrope_section=(2, 2, 2), norm_eps=1e-5)


def build(out_dir: Path, seed: int = 0) -> None:
    """Write a tiny random Ideogram 4-shaped model as a diffusers folder."""
    import torch
    from diffusers import FlowMatchEulerDiscreteScheduler, Ideogram4Pipeline

    out_dir = Path(out_dir)
    vae = tiny_flux2_vae(seed + 1)
    calibrate_packed_bn(vae, seed + 1)
    channels = 4 * vae.config.latent_channels
    torch.manual_seed(seed)
    transformer = tiny_transformer(channels)
    torch.manual_seed(seed + 3)
    unconditional = tiny_transformer(channels)
    tokenizer = vl_tokenizer(out_dir / "tokenizer")
    pipe = Ideogram4Pipeline(
        scheduler=FlowMatchEulerDiscreteScheduler(num_train_timesteps=1000, shift=1.0),
        vae=vae, text_encoder=tiny_text_encoder(len(tokenizer), seed + 2),
        tokenizer=tokenizer, transformer=transformer,
        unconditional_transformer=unconditional)
    pipe.save_pretrained(str(out_dir), safe_serialization=True)

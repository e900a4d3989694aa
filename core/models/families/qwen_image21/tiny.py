"""Tiny random Qwen-Image 2.1 (`tiny:qwen_image21`): a QwenImage21Transformer2DModel with
two single-stream blocks (unpatched 64-channel latents, the real model's), Qwen-Image
2.1's own causal VAE (AutoencoderKLQwenImage21: RGBA in, 64 latent channels, 16x in
space as the real one, 8 wide) with calibrated latents_mean/latents_std, a two-layer
32-wide Qwen3VLForConditionalGeneration with the tiny Qwen tokenizer
(core/models/tiny/qwen.py, built for 2.1's template, with the vision tokens the pipeline
looks up) in a Qwen3VLProcessor (processor.py), and the dynamically shifted
FlowMatchEulerDiscreteScheduler config of full_size/scheduler."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from core.models.families.qwen_image21.processor import new_processor
from core.models.tiny.qwen import HEAD_DIM, IM_END, TEMPLATE_SUFFIX, qwen_tokenizer

TEXT_DIM = 32  # the tiny Qwen3-VL's width = the transformer's context_in_dim
Z_DIM = 64  # the real VAE's latent channels (the transformer's in_channels)
# QwenImage21Pipeline.prompt_template_t2i, up to the user's text.
SYSTEM = "Comprehend and analyze the provided prompt."
TEMPLATE_PREFIX = f"<|im_start|>system\n{SYSTEM}<|im_end|>\n<|im_start|>user\n"
TEMPLATE_DROP = 15  # the tiny tokenizer's count of TEMPLATE_PREFIX (whole words)
# Qwen3-VL's chat template, as far as the pipeline uses it: messages whose content is a
# string or a list of {"type": "text"} / {"type": "image"} parts.
CHAT_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' }}"
    "{% if message['content'] is string %}{{ message['content'] }}{% else %}"
    "{% for part in message['content'] %}{% if part['type'] == 'text' %}{{ part['text'] }}"
    "{% else %}{{ '<|vision_start|><|image_pad|><|vision_end|>' }}{% endif %}{% endfor %}"
    "{% endif %}{{ '<|im_end|>\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")
# full_size/scheduler/scheduler_config.json (see full_size/SOURCES.md).
SCHEDULER = {"num_train_timesteps": 1000, "shift": 1.0, "use_dynamic_shifting": True,
             "base_shift": 0.5, "max_shift": 1.15, "base_image_seq_len": 256,
             "max_image_seq_len": 4096, "time_shift_type": "exponential"}


def tokenizer(out_dir: Path) -> Any:
    """The tiny Qwen tokenizer for 2.1's template, the vision tokens special."""
    tok = qwen_tokenizer(out_dir, TEMPLATE_PREFIX, TEMPLATE_SUFFIX, TEMPLATE_DROP, vision=True)
    tok.chat_template = CHAT_TEMPLATE
    return tok


def processor(tok: Any) -> Any:
    """The Qwen3VLProcessor over the tiny tokenizer (random:'s too)."""
    return new_processor(tok, CHAT_TEMPLATE)


def tiny_qwen3_vl(tok: Any, seed: int) -> Any:
    """A Qwen3VLForConditionalGeneration (text model TEXT_DIM wide, two layers, mrope
    sections 2/3/3; a one-block vision tower) for `tok`'s vocabulary and vision ids."""
    import torch
    from transformers import Qwen3VLConfig, Qwen3VLForConditionalGeneration

    heads = TEXT_DIM // HEAD_DIM
    vocab = tok.get_vocab()
    ids = {"bos_token_id": None, "eos_token_id": tok.convert_tokens_to_ids(IM_END),
           "pad_token_id": tok.pad_token_id}
    config = Qwen3VLConfig(
        text_config={
            "vocab_size": len(tok), "hidden_size": TEXT_DIM, "intermediate_size": 2 * TEXT_DIM,
            "num_hidden_layers": 2, "num_attention_heads": heads, "num_key_value_heads": heads,
            "head_dim": HEAD_DIM, "max_position_embeddings": 2048, "rms_norm_eps": 1e-6,
            "rope_parameters": {"rope_type": "default", "rope_theta": 5000000.0,
                                "mrope_section": [2, 3, 3], "mrope_interleaved": True},
            **ids},
        vision_config={"depth": 1, "hidden_size": 16, "intermediate_size": 16, "num_heads": 2,
                       "out_hidden_size": TEXT_DIM, "deepstack_visual_indexes": []},
        image_token_id=vocab["<|image_pad|>"], video_token_id=vocab["<|video_pad|>"],
        vision_start_token_id=vocab["<|vision_start|>"],
        vision_end_token_id=vocab["<|vision_end|>"], tie_word_embeddings=False)
    torch.manual_seed(seed)
    return Qwen3VLForConditionalGeneration(config).eval()


def tiny_vae(seed: int) -> Any:
    """AutoencoderKLQwenImage21 at 8 wide: five levels (16x in space), 8x in time, RGBA in
    and out, 64 latent channels, calibrated (`calibrate`)."""
    import torch
    from diffusers import AutoencoderKLQwenImage21

    torch.manual_seed(seed)
    vae = AutoencoderKLQwenImage21(
        base_dim=8, decoder_base_dim=8, z_dim=Z_DIM, dim_mult=[1, 2, 2, 2, 2],
        num_res_blocks=1, temperal_downsample=[False, True, True, True],
        latents_mean=[0.0] * Z_DIM, latents_std=[1.0] * Z_DIM)
    calibrate(vae, seed)
    return vae


def calibrate(vae: Any, seed: int) -> None:
    """latents_mean/latents_std per channel from smooth synthetic opaque images, as
    core/models/tiny/causal_vae.py does for the 3-channel VAEs."""
    import torch
    import torch.nn.functional as F

    generator = torch.Generator().manual_seed(seed)
    coarse = torch.rand(8, 3, 4, 4, generator=generator) * 2 - 1
    rgb = F.interpolate(coarse, size=(64, 64), mode="bilinear", align_corners=False)
    rgba = torch.cat([rgb, torch.ones_like(rgb[:, :1])], dim=1)
    with torch.no_grad():
        latents = vae.encode(rgba.unsqueeze(2)).latent_dist.mean
    per_channel = latents.transpose(0, 1).reshape(Z_DIM, -1)
    vae.register_to_config(
        latents_mean=[round(float(v), 4) for v in per_channel.mean(dim=1)],
        latents_std=[round(float(v), 4) for v in per_channel.std(dim=1)])


def build(out_dir: Path, seed: int = 0) -> None:
    """Write a tiny random Qwen-Image-2.1-shaped model as a diffusers folder."""
    import torch
    from diffusers import (
        FlowMatchEulerDiscreteScheduler,
        QwenImage21Pipeline,
        QwenImage21Transformer2DModel,
    )

    out_dir = Path(out_dir)
    torch.manual_seed(seed)
    transformer = QwenImage21Transformer2DModel(
        patch_size=1, in_channels=Z_DIM, out_channels=Z_DIM, num_layers=2,
        attention_head_dim=16, num_attention_heads=2, context_in_dim=TEXT_DIM,
        axes_dims_rope=(4, 6, 6))
    _randomize_modulation(transformer, seed)
    tok = tokenizer(out_dir / "tokenizer")
    pipe = QwenImage21Pipeline(
        transformer=transformer, vae=tiny_vae(seed + 1),
        scheduler=FlowMatchEulerDiscreteScheduler(**SCHEDULER),
        text_encoder=tiny_qwen3_vl(tok, seed + 2), processor=processor(tok))
    pipe.save_pretrained(str(out_dir), safe_serialization=True)
    _remove_tree(out_dir / "tokenizer")  # the processor/ folder holds the tokenizer


def _randomize_modulation(transformer: Any, seed: int) -> None:
    """The shared modulation and the output norm's scale start near zero, so the tanh
    gates barely open: larger random values let every block's attention and MLP through."""
    import torch

    g = torch.Generator().manual_seed(seed + 3)
    with torch.no_grad():
        for name, p in transformer.named_parameters():
            if name.startswith(("modulation.", "norm_out.")):
                p.copy_(torch.randn(p.shape, generator=g) * 0.5)


def _remove_tree(folder: Path) -> None:
    import shutil

    shutil.rmtree(folder, ignore_errors=True)

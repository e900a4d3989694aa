"""Tiny random Krea 2: a Krea2Transformer2DModel with one block (and the real model's
text-fusion layout, 2 layerwise + 2 refiner blocks, at a tiny width), the Qwen-Image
causal VAE (AutoencoderKLQwenImage, 16 latent channels, spatial scale 8) with calibrated
latents_mean/latents_std, a 36-layer 32-wide Qwen3VLModel (the real Qwen3-VL-4B's depth,
so the pipeline's default hidden-state taps 2, 5, ..., 35 exist) with the tiny Qwen
tokenizer (core/models/tiny/qwen.py: Krea 2 uses Qwen-Image's prompt template, whose
system part is 34 tokens as with the real tokenizer), and Krea 2's dynamically shifted
FlowMatchEulerDiscreteScheduler config (full_size/scheduler)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from core.models.tiny.causal_vae import Z_DIM, calibrate_causal_vae, tiny_causal_vae
from core.models.tiny.qwen import IM_END, qwen_tokenizer

TEXT_DIM = 32  # the tiny Qwen3-VL's width = the transformer's text_hidden_dim
TEXT_LAYERS = 36  # Qwen3-VL-4B's depth: hidden_states holds 37 entries
HEAD_DIM = 16
# Krea 2's scheduler (Krea2Pipeline's docstring; full_size/scheduler/scheduler_config.json).
SCHEDULER = {"num_train_timesteps": 1000, "shift": 1.0, "use_dynamic_shifting": True,
             "base_shift": 0.5, "max_shift": 1.15, "base_image_seq_len": 256,
             "max_image_seq_len": 6400, "time_shift_type": "exponential"}


def tiny_qwen3_vl(tokenizer: Any, seed: int) -> Any:
    """A Qwen3VLModel (text model TEXT_DIM wide, TEXT_LAYERS deep, multimodal rope
    sections 2/3/3 = half its head_dim; a one-block 16-wide vision tower the pipeline
    never runs) for `tokenizer`'s vocabulary, random weights from `seed`."""
    import torch
    from transformers import Qwen3VLConfig, Qwen3VLModel

    heads = TEXT_DIM // HEAD_DIM
    ids = {"bos_token_id": None, "eos_token_id": tokenizer.convert_tokens_to_ids(IM_END),
           "pad_token_id": tokenizer.pad_token_id}
    config = Qwen3VLConfig(
        text_config={
            "vocab_size": len(tokenizer), "hidden_size": TEXT_DIM,
            "intermediate_size": 2 * TEXT_DIM, "num_hidden_layers": TEXT_LAYERS,
            "num_attention_heads": heads, "num_key_value_heads": heads, "head_dim": HEAD_DIM,
            "max_position_embeddings": 2048, "rms_norm_eps": 1e-6,
            "rope_parameters": {"rope_type": "default", "rope_theta": 5000000.0,
                                "mrope_section": [2, 3, 3], "mrope_interleaved": True},
            **ids},
        vision_config={"depth": 1, "hidden_size": 16, "intermediate_size": 16, "num_heads": 2,
                       "out_hidden_size": TEXT_DIM, "deepstack_visual_indexes": []},
        tie_word_embeddings=False)
    torch.manual_seed(seed)
    return Qwen3VLModel(config).eval()


def build(out_dir: Path, seed: int = 0) -> None:
    """Write a tiny random Krea-2-shaped model as a diffusers folder."""
    import torch
    from diffusers import FlowMatchEulerDiscreteScheduler, Krea2Pipeline, Krea2Transformer2DModel

    out_dir = Path(out_dir)
    torch.manual_seed(seed)
    transformer = Krea2Transformer2DModel(
        in_channels=4 * Z_DIM, num_layers=1, attention_head_dim=16, num_attention_heads=2,
        num_key_value_heads=1, intermediate_size=64, timestep_embed_dim=32,
        text_hidden_dim=TEXT_DIM, num_text_layers=12, text_num_attention_heads=2,
        text_num_key_value_heads=2, text_intermediate_size=64, axes_dims_rope=(4, 6, 6))
    _randomize_tables(transformer, seed)
    vae = tiny_causal_vae("AutoencoderKLQwenImage", seed + 1)
    calibrate_causal_vae(vae, seed)
    tokenizer = qwen_tokenizer(out_dir / "tokenizer")
    pipe = Krea2Pipeline(
        transformer=transformer, vae=vae, scheduler=FlowMatchEulerDiscreteScheduler(**SCHEDULER),
        text_encoder=tiny_qwen3_vl(tokenizer, seed + 2), tokenizer=tokenizer)
    pipe.save_pretrained(str(out_dir), safe_serialization=True)


def _randomize_tables(transformer: Any, seed: int) -> None:
    """The modulation tables start at zero (a trained model's are not): small random
    values, so every block's gates let its attention and feed-forward through."""
    import torch

    g = torch.Generator().manual_seed(seed + 3)
    with torch.no_grad():
        for name, p in transformer.named_parameters():
            if name.endswith("scale_shift_table"):
                p.copy_(torch.randn(p.shape, generator=g) * 0.5)

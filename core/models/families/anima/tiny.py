"""Tiny random Anima, written as diffusers writes a modular pipeline (AnimaAutoBlocks'
init_pipeline, update_components, save_pretrained: modular_model_index.json, no
model_index.json): a two-block CosmosTransformer3DModel with Anima's Cosmos-Predict2
options (no learnable position embedding, the padding-mask channel, rope scale 1/4/4),
a two-block AnimaTextConditioner that pads to the real 512 tokens, a two-layer Qwen3Model
with the tiny Qwen tokenizer (core/models/tiny/qwen3.py), the tiny T5 tokenizer (the
conditioner's query ids), the Qwen-Image causal VAE (AutoencoderKLQwenImage) with
calibrated latents_mean/latents_std, and Anima's scheduler (FlowMatchEulerDiscreteScheduler
with shift 3, diffusers' conversion recipe for Anima)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from core.models.tiny.causal_vae import Z_DIM, calibrate_causal_vae, tiny_causal_vae

TEXT_DIM = 32  # the tiny Qwen3's width = the conditioner's source_dim
CROSS_DIM = 32  # the conditioner's output = the transformer's text_embed_dim
SCHEDULER = {"num_train_timesteps": 1000, "shift": 3.0}  # full_size/scheduler


def tiny_transformer(seed: int) -> Any:
    """CosmosTransformer3DModel shaped as Anima's (full_size/transformer), tiny."""
    import torch
    from diffusers import CosmosTransformer3DModel

    torch.manual_seed(seed)
    model = CosmosTransformer3DModel(
        in_channels=Z_DIM, out_channels=Z_DIM, num_attention_heads=2, attention_head_dim=24,
        num_layers=2, mlp_ratio=2.0, text_embed_dim=CROSS_DIM, adaln_lora_dim=8,
        max_size=(128, 240, 240), patch_size=(1, 2, 2), rope_scale=(1.0, 4.0, 4.0),
        concat_padding_mask=True, extra_pos_embed_type=None)
    _randomize_gates(model, seed)
    return model


def _randomize_gates(model: Any, seed: int) -> None:
    """Small random weights where diffusers starts at zero, so every block's gates let its
    attention and feed-forward through (a trained model's do)."""
    import torch

    g = torch.Generator().manual_seed(seed + 3)
    with torch.no_grad():
        for p in model.parameters():
            if p.abs().max() == 0:
                p.copy_(torch.randn(p.shape, generator=g) * 0.1)


def build(out_dir: Path, seed: int = 0) -> None:
    """Write a tiny random Anima-shaped modular pipeline folder."""
    import torch
    from diffusers import AnimaAutoBlocks, AnimaTextConditioner, FlowMatchEulerDiscreteScheduler

    from core.models.tiny.qwen3 import qwen_tokenizer, tiny_qwen3
    from core.models.tiny.t5 import t5_tokenizer

    out_dir = Path(out_dir)
    transformer = tiny_transformer(seed)
    torch.manual_seed(seed + 4)
    t5_tok, t5_vocab = t5_tokenizer(out_dir / "t5_tokenizer")
    conditioner = AnimaTextConditioner(
        source_dim=TEXT_DIM, target_dim=CROSS_DIM, model_dim=CROSS_DIM, num_layers=2,
        num_attention_heads=2, mlp_ratio=2.0, target_vocab_size=t5_vocab,
        min_sequence_length=512)
    vae = tiny_causal_vae("AutoencoderKLQwenImage", seed + 1)
    calibrate_causal_vae(vae, seed)
    tokenizer = qwen_tokenizer(out_dir / "tokenizer")
    encoder = tiny_qwen3(len(tokenizer), TEXT_DIM, 2, seed + 2, causal_lm=False)
    pipe = AnimaAutoBlocks().init_pipeline()
    pipe.update_components(
        transformer=transformer, text_conditioner=conditioner, vae=vae,
        text_encoder=encoder, tokenizer=tokenizer, t5_tokenizer=t5_tok,
        scheduler=FlowMatchEulerDiscreteScheduler(**SCHEDULER))
    pipe.save_pretrained(str(out_dir), safe_serialization=True, overwrite_modular_index=True)

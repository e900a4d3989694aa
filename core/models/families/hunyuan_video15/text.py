"""HunyuanVideo 1.5's two text encoders, and why their output travels as one tensor.

HunyuanVideo15Pipeline.encode_prompt gives four tensors per prompt: the Qwen2.5-VL text
model's third-to-last hidden state over the chat template, the template's 108 system
tokens dropped ([1000, 3584], mask), and ByT5's encoding of the prompt's quoted text
(the glyph text, "Text \"...\". "; [256, 1472], mask; zeros and an all-False mask for a
prompt without quotes). The transformer puts each stream's real tokens first and zeroes
the rest (its forward reorders [image, ByT5, Qwen] by the masks), so the padding
changes nothing it computes: each prompt keeps only its real tokens of each stream.

The shared text cache, caption dropout, the shuffled-caption eval and validation carry
one `prompt_embeds` [L, D] and one `prompt_mask` [L] per prompt (core/train/texts.py);
collate right-pads L with zeros. So the two streams sit side by side in one row per
token: [Qwen (D1) | ByT5 (D2) | Qwen real | ByT5 real], L = the longer stream's real
tokens, each stream zero after its own, the last two columns its masks (1.0 / 0.0, exact
in bf16; collate's zero padding reads as "not real"). `prompt_mask` marks a row real in
either stream. `unpack` splits a batch back into the transformer's four inputs; the
widths come from the transformer's config (text_embed_dim, text_embed_2_dim).
"""

from __future__ import annotations

from typing import Any

FLAG_COLUMNS = 2


def pack(embeds: Any, mask: Any, glyph: Any, glyph_mask: Any) -> list[dict[str, Any]]:
    """Per prompt, the real tokens of both streams as one [L, D1 + D2 + 2] tensor (see
    the module docstring) and its `prompt_mask` [L]."""

    out = []
    for e, m, g, gm in zip(embeds, mask.bool(), glyph, glyph_mask.bool(), strict=True):
        first, second = e[m], g[gm].to(e.dtype)
        rows = max(first.shape[0], second.shape[0], 1)
        packed = e.new_zeros(rows, e.shape[1] + g.shape[1] + FLAG_COLUMNS)
        packed[:first.shape[0], :e.shape[1]] = first
        packed[:second.shape[0], e.shape[1]:e.shape[1] + g.shape[1]] = second
        packed[:first.shape[0], -2] = 1.0
        packed[:second.shape[0], -1] = 1.0
        out.append({"prompt_embeds": packed, "prompt_mask": packed[:, -2:].amax(1) > 0})
    return out


def unpack(packed: Any, text_dim: int, glyph_dim: int) -> dict[str, Any]:
    """A batch [B, L, D1 + D2 + 2] as the transformer's encoder_hidden_states [B, L, D1],
    encoder_attention_mask [B, L], encoder_hidden_states_2 [B, L, D2] and
    encoder_attention_mask_2 [B, L]. A width that is not D1 + D2 + 2 is a text cache of
    another model, named with its fix."""
    width = text_dim + glyph_dim + FLAG_COLUMNS
    if packed.shape[-1] != width:
        raise ValueError(f"hunyuan_video15 text embeddings are {packed.shape[-1]} wide, this "
                         f"model takes {width} (Qwen {text_dim} + ByT5 {glyph_dim} + 2 masks): "
                         "the text cache was built by another model; delete it to rebuild")
    return {"encoder_hidden_states": packed[..., :text_dim],
            "encoder_attention_mask": packed[..., -2] > 0.5,
            "encoder_hidden_states_2": packed[..., text_dim:text_dim + glyph_dim],
            "encoder_attention_mask_2": packed[..., -1] > 0.5}


def encode(pipe: Any, prompts: list[str], device: Any) -> list[dict[str, Any]]:
    """The prompts through the pipeline's own encode_prompt (both encoders, its template,
    lengths and glyph extraction), packed."""
    import torch

    with torch.no_grad():
        embeds, mask, glyph, glyph_mask = pipe.encode_prompt(
            prompt=prompts, device=device, dtype=pipe.text_encoder.dtype,
            batch_size=len(prompts))
    return pack(embeds, mask, glyph, glyph_mask)

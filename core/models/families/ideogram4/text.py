"""Ideogram 4's text features and its packed [left-padded text][image] sequence, as
Ideogram4Pipeline builds them (`encode_prompt`, `_prepare_ids`), and its latent packing,
as train_dreambooth_lora_ideogram4.py's `patchify_latents` (the inverse of the pipeline's
decode).

Text: each prompt in the chat template as one user message whose content is a list with
one text part, with the generation prompt, tokenized without special tokens; the
decoder layers of the Qwen3-VL text model run on it, and the hidden states of the 13
layers QWEN3_VL_ACTIVATION_LAYERS are concatenated along features (per token: layer
0's features first) -> [L, 13 x hidden] (53248 for the real 4096-wide encoder). Only the
prompt's real tokens are kept (`encode_text`): the pipeline left-pads every prompt to
max_sequence_length, but the encoder is causal and its mask hides the padding, and in
the transformer the padding has its own segment id, which no text or image token
attends to; so the real tokens' features, and the image tokens' output, do not depend
on the padding, and `layout` pads a batch only to its longest prompt.
"""

from __future__ import annotations

from typing import Any

PATCH = 2  # Ideogram4Pipeline.patch_size


def patchify(z: Any) -> Any:
    """VAE latents [B, C, H, W] -> packed [B, 4C, H/2, W/2], channel order (patch row,
    patch column, C): the token layout's channels, kept as a 4-D map for the caches."""
    b, c, h, w = z.shape
    z = z.reshape(b, c, h // PATCH, PATCH, w // PATCH, PATCH)
    return z.permute(0, 3, 5, 1, 2, 4).reshape(b, PATCH * PATCH * c, h // PATCH, w // PATCH)


def to_tokens(packed: Any) -> Any:
    """[B, D, gh, gw] -> [B, gh*gw, D], row-major over the grid (the pipeline's order)."""
    return packed.flatten(2).transpose(1, 2)


def from_tokens(tokens: Any, gh: int, gw: int) -> Any:
    """The inverse of `to_tokens`."""
    return tokens.transpose(1, 2).reshape(tokens.shape[0], tokens.shape[2], gh, gw)


def token_ids(tokenizer: Any, prompt: str) -> Any:
    """The pipeline's tokenization of one prompt (its chat template, no special tokens)."""
    messages = [{"role": "user", "content": [{"type": "text", "text": prompt}]}]
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return tokenizer(text, return_tensors="pt", add_special_tokens=False)["input_ids"][0]


def encode_text(text_encoder: Any, tokenizer: Any, prompt: str, limit: int) -> Any:
    """[L, 13 x hidden] float32 features of one prompt's L real tokens (L <= limit)."""
    import torch
    from diffusers import Ideogram4Pipeline

    ids = token_ids(tokenizer, prompt)
    n = int(ids.shape[0])
    if n > limit:
        raise ValueError(f"an ideogram4 prompt has {n} tokens, more than "
                         f"max_sequence_length {limit}: shorten the caption")
    device = text_encoder.device
    ids = ids[None].to(device)
    mask = torch.ones_like(ids)
    pos = torch.arange(n, device=device)[None]
    with torch.no_grad():
        taps = Ideogram4Pipeline._get_text_encoder_hidden_states(text_encoder, ids, mask, pos)
    return torch.stack(taps, dim=0).permute(1, 2, 3, 0).reshape(n, -1).float()


def layout(embeds: Any, mask: Any, gh: int, gw: int) -> dict[str, Any]:
    """The transformer's packed inputs for a batch of collated text (embeds [B, L, D],
    mask [B, L] marking each prompt's real tokens, right-padded by collate) and an image
    grid: each prompt's tokens moved to the end of a text region as long as the longest
    prompt (left padding, as the pipeline), then the image tokens. Returns
    encoder_hidden_states (zero at padding and image rows), position_ids, segment_ids,
    indicator, and `text_len` (where the image tokens start)."""
    import torch
    from diffusers import Ideogram4Pipeline

    b = embeds.shape[0]
    lengths = [int(n) for n in mask.bool().sum(dim=1).tolist()]
    if min(lengths) == 0:
        raise ValueError("an ideogram4 prompt embedding has no real tokens: the text "
                         "cache is damaged; delete the text cache to rebuild it")
    text_len = max(lengths)
    feats = torch.zeros(b, text_len + gh * gw, embeds.shape[2], dtype=embeds.dtype,
                        device=embeds.device)
    for i, n in enumerate(lengths):
        feats[i, text_len - n:text_len] = embeds[i][mask[i].bool()]
    pos, seg, ind = Ideogram4Pipeline._prepare_ids(lengths, gh, gw, text_len, embeds.device)
    return {"encoder_hidden_states": feats, "position_ids": pos, "segment_ids": seg,
            "indicator": ind, "text_len": text_len}


def resolution_mu(base_mu: float, height: int, width: int) -> float:
    """The logit-normal mean at a resolution: the pipeline's `_resolution_aware_mu`,
    base + 0.5 * log(pixels / 512^2)."""
    from diffusers.pipelines.ideogram4.pipeline_ideogram4 import _resolution_aware_mu

    return _resolution_aware_mu(height=height, width=width, base_mu=base_mu)

"""LTX-2's prompts, cached as what its transformer reads: Gemma 3's hidden states of every
layer (LTX2Pipeline._get_gemma_prompt_embeds: left-padded to max_sequence_length = 1024,
the pipeline's default), then the frozen LTX2TextConnectors (the projection of all layers
and one connector per modality, whose learnable registers replace the padding), as
LTX2Pipeline.__call__ runs them before its denoising loop.

The cache holds one tensor per prompt: the video connector's output and the audio
connector's side by side on the features, [1024, D_video + D_audio] (`prompt_embeds`),
and the connectors' mask (`prompt_mask`), which the transformer gets as both streams'
encoder_attention_mask. `split` takes the two apart again (at the video connector's
width, versions.video_text_width: LTX-2.0's caption_channels, LTX-2.3's
cross_attention_dim), for training and for validation (pipelines.py). The connectors
are large in the real model (about 1.4 B parameters): they come to the text encoder's
device for the encoding and go back after it.
"""

from __future__ import annotations

from typing import Any

MAX_SEQUENCE_LENGTH = 1024


def split(embeds: Any, video_dim: int) -> tuple[Any, Any]:
    """(video, audio) text embeddings of cached `prompt_embeds` [..., D_video + D_audio]."""
    return embeds[..., :video_dim], embeds[..., video_dim:]


def encode(pipe: Any, connectors: Any, prompts: list[str], length: int) -> list[dict[str, Any]]:
    """One dict per prompt (see the module docstring); `pipe` is an LTX2Pipeline holding
    the text encoder and tokenizer."""
    import torch

    device = pipe.text_encoder.device
    home = next(connectors.parameters()).device
    connectors.to(device)
    try:
        with torch.no_grad():
            embeds, mask, _, _ = pipe.encode_prompt(
                prompt=prompts, do_classifier_free_guidance=False,
                max_sequence_length=length, device=device)
            padding_side = getattr(pipe.tokenizer, "padding_side", "left")
            video, audio, out_mask = connectors(embeds.to(connectors.dtype), mask,
                                                padding_side=padding_side)
    finally:
        connectors.to(home)
    both = torch.cat([video, audio], dim=-1)
    return [{"prompt_embeds": both[i], "prompt_mask": out_mask[i].bool()}
            for i in range(len(prompts))]

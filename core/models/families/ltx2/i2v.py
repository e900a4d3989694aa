"""LTX-2 image-to-video (model.ltx2_mode = "image_to_video", options.py): training
conditioned as LTX2ImageToVideoPipeline (diffusers 0.42, pipeline_ltx2_image2video.py)
conditions sampling.

The pipeline encodes the first image alone ([B, 3, 1, H, W], the VAE's mode, normalised)
and puts it on the first latent frame; the other frames start as noise
(`prepare_latents`: latents = image * mask + noise * (1 - mask), `conditioning_mask` 1 on
the first latent frame's tokens). At every step the transformer gets the video timestep
per token, t * (1 - conditioning_mask): 0 on the first frame's tokens, t on the others;
the audio timestep and `sigma` stay t. Only frames 1.. are stepped (`noise_pred_video[:,
:, 1:]`), so the first frame stays the clean image and its prediction is discarded.

Training does the same with each clip's own first frame: noisy = the clean latents on
the first latent frame, (1 - s) x + s n on the others; per-token timesteps as above; the
loss over frames 1.. only (the target n - x is unchanged). The cached clip latents need
no extra entry: the LTX-2 video VAE's encoder is causal (`encoder_causal`), so a clip's
first latent frame is the first frame's latents encoded alone, what the pipeline
encodes from the image. Not reproduced: the pipeline's H.264 re-compression of the
conditioning image (`image_crf`): a training clip's first frame comes compressed already.
"""

from __future__ import annotations

from typing import Any

from core.models.capabilities import FirstImageSpec
from core.models.families.ltx2.options import IMAGE_TO_VIDEO, TEXT_TO_VIDEO


def takes_first_image(model: Any) -> bool:
    """model.ltx2_mode: one checkpoint does both, so the config says (options.py)."""
    return getattr(model, "ltx2_mode", TEXT_TO_VIDEO) == IMAGE_TO_VIDEO


FIRST_IMAGE = FirstImageSpec(takes_first_image, switch=f'model.ltx2_mode = "{IMAGE_TO_VIDEO}"')


def keep_first_frame(noisy: Any, latents: Any) -> Any:
    """`noisy` [B, C, F', h, w] with its first latent frame replaced by the clean one."""
    import torch

    return torch.cat([latents[:, :, :1].to(noisy.dtype), noisy[:, :, 1:]], dim=2)


def conditioning_mask(latents: Any) -> Any:
    """[B, tokens]: 1 on the first latent frame's tokens, 0 after, as prepare_latents
    builds and packs it (1x1x1 patches: tokens in frame, row, column order)."""
    from diffusers import LTX2Pipeline

    b, _, f, h, w = latents.shape
    mask = latents.new_zeros(b, 1, f, h, w)
    mask[:, :, 0] = 1.0
    return LTX2Pipeline._pack_latents(mask).squeeze(-1)


def video_timesteps(timesteps: Any, latents: Any) -> Any:
    """[B, tokens]: each item's timestep on its tokens, 0 on the first latent frame's
    (the pipeline's `timestep.unsqueeze(-1) * (1 - conditioning_mask)`)."""
    mask = conditioning_mask(latents).to(timesteps.device, timesteps.dtype)
    return timesteps.reshape(-1, 1) * (1 - mask)

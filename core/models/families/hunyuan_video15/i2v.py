"""HunyuanVideo 1.5 image-to-video (hunyuanvideo-community/HunyuanVideo-1.5-Diffusers-480p_i2v,
-720p_i2v): training conditioned as HunyuanVideo15ImageToVideoPipeline conditions sampling.

The pipeline (diffusers 0.42, pipeline_hunyuan_video1_5_image2video.py) gives the
transformer the noisy latents [B, 32, F', h, w] with, on channels, `latent_condition`
(the VAE's mode of the first image alone, a one-frame clip, times scaling_factor, on the
first latent frame; zeros on the others) and `latent_mask` (one channel: 1 on the first
latent frame, 0 after), and `image_embeds`: the SigLIP vision encoder's last hidden state
of the first image ([729, 1152] in the real model), which the transformer then attends to
(a non-zero image_embeds turns its image tokens on). Every latent frame is noised and
trained, the first too, as the pipeline denoises them all.

Why cached: `predict` sees latents, not pixels, and the condition depends only on the
item's pixels, so it is encoded once, into the latents' cache entry: `encode_images`
returns a dict (core/cache/build.py saves every tensor of it into the entry), and the
dataset hands the extra tensors to `predict` as per-item lists (`I2V_KEYS`). The first
frame's latents are cached alone ([32, 1, h, w]); the zeros and the mask are built at
train time. An entry without them (built by the text-to-video model) is refused by
`predict`, naming the fix; a cache of another model is stale through its fingerprint.

The image encoder and its processor live on `I2VComponents` (a family-private subclass
of Components, kept by dataclasses.replace), loaded on the device with the rest.
A step-distilled model (the transformer's `use_meanflow`, which takes a second timestep)
is refused at load: not trained here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from core.models.base import Components
from core.models.capabilities import FirstImageSpec
from core.models.source import names_pipeline
from core.models.video_pipeline import pixels_to_pil

I2V_PIPELINE = "HunyuanVideo15ImageToVideoPipeline"
CONDITION = "hv15_first_frame_latents"  # [32, 1, h, w]: the first image's latents
IMAGE_EMBEDS = "hv15_image_embeds"  # [tokens, image_embed_dim]: SigLIP's last hidden state
I2V_KEYS = (CONDITION, IMAGE_EMBEDS)


@dataclass
class I2VComponents(Components):
    """A loaded image-to-video model: the SigLIP vision encoder and its processor beside
    the shared Components."""

    image_encoder: Any = None
    feature_extractor: Any = None


def takes_first_image(model: Any) -> bool:
    """An image-to-video model (its folder names HunyuanVideo15ImageToVideoPipeline, or
    tiny:hunyuan_video15_i2v): validation.control_images gives each validation prompt
    its first frame."""
    return names_pipeline(model.path, I2V_PIPELINE, "hunyuan_video15_i2v")


FIRST_IMAGE = FirstImageSpec(takes_first_image)


def is_i2v(c: Components) -> bool:
    return isinstance(c, I2VComponents)


def i2v_components(c: Components, pipe: Any, source: str) -> Components:
    """`c` as I2VComponents with the pipeline's image encoder and processor when `pipe`
    is the image-to-video pipeline; `c` itself otherwise. A step-distilled transformer
    (use_meanflow) is refused."""
    from diffusers import HunyuanVideo15ImageToVideoPipeline

    from core.models import loading

    if pipe.transformer.config.get("use_meanflow"):
        raise loading.ModelLoadError(source, "is a step-distilled HunyuanVideo 1.5 model "
                                     "(use_meanflow), which this version does not train; "
                                     "use the 480p or 720p model it was distilled from")
    if not isinstance(pipe, HunyuanVideo15ImageToVideoPipeline):
        return c
    fields = {k: getattr(c, k) for k in c.__dataclass_fields__}
    return I2VComponents(**fields, image_encoder=pipe.image_encoder,
                         feature_extractor=pipe.feature_extractor)


def encode_condition(c: I2VComponents, video: Any, encode: Any) -> dict[str, Any]:
    """The cached condition of pixels [B, 3, F, H, W]: CONDITION, `encode` (the family's
    latents) of the first frame alone; IMAGE_EMBEDS, the image encoder's last hidden
    state of it (HunyuanVideo15ImageToVideoPipeline._get_image_embeds)."""
    import torch

    first = video[:, :, :1]
    latents = encode(first)
    encoder = c.image_encoder
    params = next(encoder.parameters())
    inputs = c.feature_extractor.preprocess(images=pixels_to_pil(first[:, :, 0]), do_resize=True,
                                            return_tensors="pt", do_convert_rgb=True)
    with torch.no_grad():
        embeds = encoder(pixel_values=inputs["pixel_values"].to(params.device, params.dtype)
                         ).last_hidden_state
    return {CONDITION: latents, IMAGE_EMBEDS: embeds.to(latents.device, latents.dtype)}


def _stacked(batch: dict[str, Any], key: str, device: Any, dtype: Any) -> Any:
    import torch

    values = batch.get(key)
    if values is None or any(v is None for v in values):
        raise ValueError(f"this HunyuanVideo 1.5 image-to-video model trains on a cached "
                         f"{key!r} beside each item's latents, which some entries lack: the "
                         "latent cache was built without the first-frame condition; delete "
                         "it to rebuild")
    tensors = values if isinstance(values, torch.Tensor) else torch.stack(list(values))
    return tensors.to(device, dtype)


def condition_inputs(noisy: Any, batch: dict[str, Any]) -> tuple[Any, Any]:
    """(the condition channels [B, 33, F', h, w], image_embeds) of an I2V batch: the
    first frame's latents on the first latent frame then zeros, and the mask."""
    first = _stacked(batch, CONDITION, noisy.device, noisy.dtype)
    if first.shape[-2:] != noisy.shape[-2:] or first.shape[1] != noisy.shape[1]:
        raise ValueError(f"cached first-frame latents {tuple(first.shape)} do not match the "
                         f"latents {tuple(noisy.shape)}; delete the latent cache")
    b, ch, frames, h, w = noisy.shape
    condition = noisy.new_zeros(b, ch + 1, frames, h, w)
    condition[:, :ch, :1] = first
    condition[:, ch, 0] = 1.0
    return condition, _stacked(batch, IMAGE_EMBEDS, noisy.device, noisy.dtype)

"""Wan image-to-video (Wan 2.1 I2V, Wan-AI/Wan2.1-I2V-14B-480P-Diffusers; Wan 2.2 I2V
A14B): training conditioned exactly as WanImageToVideoPipeline conditions sampling.

The pipeline (diffusers 0.42, pipeline_wan_i2v.py) gives the transformer (in_channels
36) the noisy latents [B, 16, F', h, w] concatenated on channels with a condition
[B, 20, F', h, w]: a 4-channel mask (`first_frame_mask`: 1 on the first latent frame, 0
after it) and the normalised VAE mode of [first frame, zeros for the other F - 1 frames]
(`prepare_latents`); a Wan 2.1 I2V transformer (config `image_dim` set) also gets
`encoder_hidden_states_image`, the second-to-last hidden state of its CLIP vision
encoder on the first frame (`encode_image`). Wan 2.2 I2V has no image encoder.

Why the condition is cached: `predict` sees latents, not pixels, and the condition
depends only on the item's pixels, so it is encoded once beside its latents. The VAE
cache's encode may return a dict of batched tensors (core/cache/build.py), saved into the
same entry as "latents", and core/cache/dataset.py passes the other tensors through to
collate, which hands them over as per-item lists (`I2V_KEYS`); `predict` stacks them.
The mask depends only on the latent shape, so it is built at train time. A cache built
for another model is stale through its fingerprint; an entry of this model without the
condition (built before this path existed) is refused by `predict`, naming the fix.

The image encoder and its processor live on `WanI2VComponents` (a family-private
subclass of Components, kept by dataclasses.replace); they are loaded on the device with
the rest and stay there.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from core.models.base import Components
from core.models.capabilities import FirstImageSpec
from core.models.source import names_pipeline
from core.models.video_pipeline import pixels_to_pil

I2V_PIPELINE = "WanImageToVideoPipeline"
CONDITION = "wan_image_condition"  # [16, F', h, w]: latents of [frame 0, zeros]
IMAGE_EMBEDS = "wan_image_embeds"  # [tokens, image_dim], Wan 2.1 I2V only
I2V_KEYS = (CONDITION, IMAGE_EMBEDS)
MASK_CHANNELS = 4  # the VAE's temporal factor: the mask of the 4 frames of a latent frame


@dataclass
class WanI2VComponents(Components):
    """A loaded Wan image-to-video model: the CLIP vision encoder and its processor (None
    for Wan 2.2 I2V, which has none) beside the shared Components."""

    image_encoder: Any = None
    image_processor: Any = None


def takes_first_image(model: Any) -> bool:
    """Whether the config's model section is an image-to-video model: its folder names
    WanImageToVideoPipeline (or it is tiny:wan_i2v)."""
    return names_pipeline(model.path, I2V_PIPELINE, "wan_i2v")


FIRST_IMAGE = FirstImageSpec(takes_first_image)


def is_i2v(c: Components) -> bool:
    return isinstance(c, WanI2VComponents)


def i2v_components(c: Components, pipe: Any, source: str) -> Components:
    """`c` as WanI2VComponents, with the image encoder/processor, when `pipe` is a
    WanImageToVideoPipeline; `c` itself otherwise. A first-last-frame model (FLF2V: its
    image embeds carry two images, `pos_embed_seq_len`) is refused."""
    from diffusers import WanImageToVideoPipeline

    from core.models import loading

    if not isinstance(pipe, WanImageToVideoPipeline):
        return c
    for model in (pipe.transformer, getattr(pipe, "transformer_2", None)):
        if model is not None and model.config.get("pos_embed_seq_len") is not None:
            raise loading.ModelLoadError(source, "is a Wan first-last-frame model (FLF2V, "
                                         "pos_embed_seq_len set), which this version does "
                                         "not train yet; use a Wan image-to-video model "
                                         "(e.g. Wan-AI/Wan2.1-I2V-14B-480P-Diffusers)")
    # The pipeline gives image embeds only to a transformer with `image_dim` (Wan 2.1).
    transformer = pipe.transformer if pipe.transformer is not None else pipe.transformer_2
    embeds = transformer.config.get("image_dim") is not None
    fields = {k: getattr(c, k) for k in c.__dataclass_fields__}
    return WanI2VComponents(**fields, image_encoder=pipe.image_encoder if embeds else None,
                            image_processor=pipe.image_processor if embeds else None)


def first_frame_mask(latents: Any) -> Any:
    """[B, 4, F', h, w]: 1 on the first latent frame, 0 after, as prepare_latents lays
    its mask out (the first pixel frame's 1 repeated 4 times, then one channel per pixel
    frame, folded 4 to a latent frame)."""
    import torch

    b, _, frames, h, w = latents.shape
    mask = torch.zeros(b, MASK_CHANNELS, frames, h, w, device=latents.device,
                       dtype=latents.dtype)
    mask[:, :, 0] = 1
    return mask


def image_embeds(c: WanI2VComponents, first: Any) -> Any:
    """WanImageToVideoPipeline.encode_image of the first frames [B, 3, H, W]: the image
    encoder's second-to-last hidden state, [B, tokens, image_dim] (float32, on the CPU)."""
    import torch

    encoder = c.image_encoder
    params = next(encoder.parameters())
    inputs = c.image_processor(images=pixels_to_pil(first), return_tensors="pt")
    pixel_values = inputs["pixel_values"].to(params.device, params.dtype)
    with torch.no_grad():
        out = encoder(pixel_values=pixel_values, output_hidden_states=True)
    return out.hidden_states[-2].float()


def encode_condition(c: WanI2VComponents, pixels: Any, encode: Any) -> dict[str, Any]:
    """The cached condition of pixels [B, 3, F, H, W]: CONDITION, `encode` (the family's
    normalised VAE mean) of [first frame, zeros]; IMAGE_EMBEDS where there is an image
    encoder."""
    import torch

    first = pixels[:, :, 0]
    video = torch.cat([pixels[:, :, :1], torch.zeros_like(pixels[:, :, 1:])], dim=2)
    out = {CONDITION: encode(video)}
    if c.image_encoder is not None:
        out[IMAGE_EMBEDS] = image_embeds(c, first).to(out[CONDITION].device)
    return out


def _stacked(batch: dict[str, Any], key: str, device: Any, dtype: Any) -> Any:
    import torch

    values = batch.get(key)
    if values is None or any(v is None for v in values):
        raise ValueError(f"this Wan image-to-video model trains on a cached {key!r} beside "
                         "each item's latents, which some entries lack: the latent cache "
                         "was built without the image condition; delete it to rebuild")
    tensors = values if isinstance(values, torch.Tensor) else torch.stack(list(values))
    return tensors.to(device, dtype)


def condition_inputs(c: WanI2VComponents, noisy: Any, batch: dict[str, Any]
                     ) -> tuple[Any, dict[str, Any]]:
    """(hidden_states, extra transformer kwargs) of an I2V batch: [noisy, mask,
    condition latents] on channels, and encoder_hidden_states_image for Wan 2.1 I2V."""
    import torch

    condition = _stacked(batch, CONDITION, noisy.device, noisy.dtype)
    if condition.shape != noisy.shape:
        raise ValueError(f"cached image condition {tuple(condition.shape)} does not match "
                         f"the latents {tuple(noisy.shape)}; delete the latent cache")
    hidden = torch.cat([noisy, first_frame_mask(noisy), condition], dim=1)
    kwargs: dict[str, Any] = {}
    if c.image_encoder is not None:
        kwargs["encoder_hidden_states_image"] = _stacked(batch, IMAGE_EMBEDS, noisy.device,
                                                         noisy.dtype)
    return hidden, kwargs

"""FLUX.2's reference images (multi-reference editing), as Flux2Pipeline and
Flux2KleinPipeline take `image` (pipeline_flux2.py / pipeline_flux2_klein.py, diffusers
0.42: `prepare_image_latents`, `_prepare_image_ids` and the denoising loop).

The pipelines encode each reference with `_encode_vae_image`: the VAE posterior mode
(sample_mode "argmax"), patchified 2x2 and normalised with the batch-norm statistics,
which is exactly the family's `encode_images` of a target, so the cache holds them as
capabilities.py's `controls_as_targets` makes them ([K, 4C, h, w] per target; `edit`
names no encode_controls). In the loop, each reference is packed (`_pack_latents`), the
references are concatenated in order after the target's tokens, and their position ids
(t, h, w, l) are `_prepare_image_ids`: reference i at t = 10 + 10 i (the target's t is
0), its own h, w grid from 0, l = 0. The transformer's output is cut back to the target's
tokens (`noise_pred[:, :latents.size(1)]`), so the loss is on the target only.

References are optional (`EditSpec.optional`): FLUX.2 is a text-to-image model that also
edits, so a dataset without control folders trains text-to-image as before.
"""

from __future__ import annotations

from typing import Any

MULTIPLE = 16  # the pipelines floor a reference's sides to vae_scale_factor * 2
# Flux2ImageProcessor.check_image_input refuses a reference side below 64 pixels and an
# aspect ratio above 8:1.
MIN_SIDE = 64
MAX_ASPECT = 8


def reference_tokens(batch: dict[str, Any], b: int, dtype: Any, device: Any
                     ) -> tuple[Any, Any] | None:
    """The batch's cached references as packed tokens [B, N, 4C] and their position ids
    [B, N, 4], references in control order (None for a batch without any)."""
    import torch
    from diffusers import Flux2KleinPipeline as P

    values = batch.get("control_latents")
    if values is None or all(v is None for v in values):
        return None
    if any(v is None for v in values):  # a micro-batch holds one dataset: not expected
        raise ValueError("flux2: some items of this batch have cached reference latents "
                         "and some do not; delete the latent cache to rebuild")
    refs = values if isinstance(values, torch.Tensor) else torch.stack(list(values))
    if refs.shape[0] != b:
        raise ValueError(f"flux2: {refs.shape[0]} items' references for a batch of {b}")
    refs = refs.to(device, dtype)  # [B, K, 4C, h, w]
    per = [refs[:, k] for k in range(refs.shape[1])]
    ids = P._prepare_image_ids([r[:1] for r in per])  # [1, N, 4], t = 10 + 10 k
    tokens = torch.cat([P._pack_latents(r) for r in per], dim=1)
    return tokens, ids.expand(b, -1, -1).to(device)


def joined(batch: dict[str, Any], packed: Any, img_ids: Any) -> tuple[Any, Any]:
    """The transformer's image input: the target's tokens and ids, then the references'
    (the pipeline's torch.cat([latents, image_latents]) and of their ids)."""
    import torch

    refs = reference_tokens(batch, packed.shape[0], packed.dtype, packed.device)
    if refs is None:
        return packed, img_ids
    if refs[0].shape[-1] != packed.shape[-1]:
        raise ValueError(f"flux2: cached references have {refs[0].shape[-1]} channels, the "
                         f"target {packed.shape[-1]}: delete the latent cache to rebuild")
    return torch.cat([packed, refs[0]], dim=1), torch.cat([img_ids, refs[1]], dim=1)


def validation_kwargs(images: list[Any], resolution: int) -> dict[str, Any]:
    """One validation prompt's references as the pipeline's `image` list, each at about
    resolution² pixels (aspect kept, sides multiples of 16) rather than the pipeline's
    own up-to-1024x1024: training fits references to their target's bucket. The area
    grows where a side would fall below the 64 pixels the pipeline takes (a small
    validation of a wide image), and an image wider or taller than 8:1 is centre-cropped
    to 8:1, which the pipeline refuses beyond (training crops to the bucket too). No
    images (an empty validation.control_images entry): drawn from the prompt alone."""
    import math

    from core.data.controls import fit_area

    def fitted(image: Any) -> Any:
        image = _at_most_8_to_1(image)
        aspect = max(image.width / image.height, image.height / image.width)
        # Cropped again: flooring the sides to 16 may leave it a little beyond 8:1.
        return _at_most_8_to_1(fit_area(
            image, max(resolution, math.ceil(MIN_SIDE * math.sqrt(aspect))), MULTIPLE))

    return {"image": [fitted(image) for image in images]} if images else {}


def _at_most_8_to_1(image: Any) -> Any:
    """`image` centre-cropped to at most MAX_ASPECT:1 (unchanged within it)."""
    w, h = image.size
    cw, ch = min(w, h * MAX_ASPECT), min(h, w * MAX_ASPECT)
    if (cw, ch) == (w, h):
        return image
    left, top = (w - cw) // 2, (h - ch) // 2
    return image.crop((left, top, left + cw, top + ch))

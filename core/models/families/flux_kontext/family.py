"""FLUX.1 Kontext: FLUX.1's transformer, text encoders and VAE, trained to edit a control
(source) image: black-forest-labs/FLUX.1-Kontext-dev, loaded as FluxKontextPipeline.

Everything but the control follows FLUX.1 (core/models/families/flux/family.py): the
text, the packing, the timestep sampling and the guidance value a guidance-distilled
model is given in training (train_guidance = 1.0, as ai-toolkit trains Kontext LoRAs).

The control, as FluxKontextPipeline's denoising loop gives it (pipeline_flux_kontext.py,
prepare_latents and __call__): the control image's latents, encoded as the target's
((z - shift) * scale of the posterior mode: `edit` names no encode_controls, so it is
capabilities.py's `controls_as_targets`; cached beside the target's latents), are packed
into 2x2-patch tokens and joined after the target's tokens on the sequence axis; their
img_ids are the target's grid positions with the first coordinate set to 1 (the
target's is 0), so the transformer tells them apart; the transformer's output is cut
back to the target's tokens before unpacking. The loss is FLUX.1's, on the target only.
Every control is resized and cropped to its target's bucket (core/data/controls.py), so
both token grids have one size.

Validation edits each prompt's validation.control_images entry: the pipeline gets the
image at validation.resolution's area (its aspect kept) with `_auto_resize` off, so a
small validation draws small instead of at Kontext's preferred 1024-pixel sizes.
"""

from __future__ import annotations

from typing import Any

from core.models.base import Components
from core.models.capabilities import EditSpec, SingleFileSpec
from core.models.families.flux.family import FluxFamily
from core.models.modules import unwrap

CONTROL_ID = 1.0  # img_ids[..., 0] of the control's tokens (the target's are 0)


def control_tokens(batch: dict[str, Any], b: int, target_ids: Any, dtype: Any,
                   device: Any) -> tuple[Any, Any]:
    """The batch's control latents as packed tokens [B, N, 4C] and their img_ids [N, 3]
    (the target's ids, first coordinate 1), one control per item."""
    import torch
    from diffusers import FluxPipeline

    values = batch.get("control_latents")
    if values is None or any(v is None for v in values):
        raise ValueError("flux_kontext trains on a cached control image beside each target's "
                         "latents, which some entries lack: the latent cache was built "
                         "without datasets.N.control; delete it to rebuild")
    controls = values if isinstance(values, torch.Tensor) else torch.stack(list(values))
    controls = controls[:, 0].to(device, dtype)  # [B, C, h, w]: Kontext takes one
    _, ch, h, w = controls.shape
    packed = FluxPipeline._pack_latents(controls, b, ch, h, w)
    ids = target_ids.clone()
    ids[..., 0] = CONTROL_ID
    return packed, ids


def validation_kwargs(images: list[Any], resolution: int) -> dict[str, Any]:
    """The control at about resolution² pixels (its aspect kept, sides multiples of 16),
    the pipeline's max_area set to match and its snap to Kontext's preferred 1024-pixel
    sizes off, so the validation size is the one asked for."""
    from core.data.controls import fit_area

    return {"image": fit_area(images[0], resolution), "max_area": resolution * resolution,
            "_auto_resize": False}


class FluxKontextFamily(FluxFamily):
    name = "flux_kontext"
    pipeline_prefix = "FluxKontext"
    pipeline_class_name = "FluxKontextPipeline"
    # A Kontext single file (flux1-kontext-dev.safetensors) has FLUX.1's keys: it is not
    # told apart from them (model.family says which), so it claims no markers of its own
    # and takes a file that looks like FLUX.1's.
    single_file = SingleFileSpec(layout_of="flux")
    single_file_default_config = "black-forest-labs/FLUX.1-Kontext-dev"
    edit = EditSpec(references=1, validation_kwargs=validation_kwargs)

    def image_tokens(self, batch: dict[str, Any], packed: Any, img_ids: Any
                     ) -> tuple[Any, Any]:
        """The target's tokens, then the control's (ids marked CONTROL_ID); FluxFamily's
        predict cuts the output back to the target's."""
        import torch

        control, control_ids = control_tokens(batch, packed.shape[0], img_ids,
                                              packed.dtype, packed.device)
        if control.shape[1] != packed.shape[1]:
            raise ValueError(f"cached control latents {control.shape[1]} tokens, target "
                             f"{packed.shape[1]}: delete the latent cache to rebuild")
        return torch.cat([packed, control], dim=1), torch.cat([img_ids, control_ids], dim=0)

    def validation_pipeline(self, c: Components) -> Any:
        """A FluxKontextPipeline sharing the loaded modules (its own scheduler)."""
        from diffusers import FluxKontextPipeline

        pipe = FluxKontextPipeline(
            transformer=unwrap(c.denoiser), scheduler=self.validation_scheduler(c),
            vae=c.vae, text_encoder=c.text_encoders[0], tokenizer=c.tokenizers[0],
            text_encoder_2=c.text_encoders[1], tokenizer_2=c.tokenizers[1])
        pipe.set_progress_bar_config(disable=True)
        return pipe


FAMILY = FluxKontextFamily()

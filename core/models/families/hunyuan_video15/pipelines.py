"""The validation pipeline: HunyuanVideo15Pipeline (or its image-to-video sibling) with
what the trainer and the LoRA files need of it (built on first use, so importing this
module needs no diffusers).

- diffusers 0.42's HunyuanVideo 1.5 pipelines have no LoRA loader, so this one mixes in
  HunyuanVideoLoraLoaderMixin (a transformer-only PEFT loader: "transformer.<module>"
  keys): `load_lora_weights`, `fuse_lora` and `save_lora_weights` then work as on
  WanPipeline, for validation, `--stage merge` and the family's saved files.
- The trainer hands over the packed text (text.py) as `prompt_embeds` /
  `negative_prompt_embeds`; they are unpacked into the pipeline's four text inputs.
- `guidance_scale` (validation.guidance_scale) becomes the guider's: the pipeline takes
  none, its ClassifierFreeGuidance component holds the scale.
- The video families' shared glue (core/models/video_pipeline.py): the output as the
  shared validation reads it, save_pretrained as the plain class, and image-to-video's
  synthetic first image where the prompt names no `image` (validation.control_images),
  sized by height/width, which that pipeline does not take (it sizes the video from the
  image and the model's target_size).
"""

from __future__ import annotations

import functools
from typing import Any

from core.models.families.hunyuan_video15.i2v import I2V_PIPELINE
from core.models.families.hunyuan_video15.text import unpack
from core.models.video_pipeline import VideoPipeline

TEXT_KEYS = ("prompt_embeds", "negative_prompt_embeds")


def unpacked_kwargs(transformer: Any, kwargs: dict[str, Any]) -> dict[str, Any]:
    """`kwargs` with each packed `prompt_embeds` / `negative_prompt_embeds` replaced by
    the pipeline's embeds, mask, embeds_2 and mask_2 of that prompt."""
    config = transformer.config
    out = dict(kwargs)
    for key in TEXT_KEYS:
        packed = out.pop(key, None)
        if packed is None:
            continue
        parts = unpack(packed, config.text_embed_dim, config.text_embed_2_dim)
        out[key] = parts["encoder_hidden_states"]
        out[f"{key}_mask"] = parts["encoder_attention_mask"].long()
        out[f"{key}_2"] = parts["encoder_hidden_states_2"]
        out[f"{key}_mask_2"] = parts["encoder_attention_mask_2"].long()
    return out


@functools.cache
def validation_pipeline_class(base_name: str = "HunyuanVideo15Pipeline") -> Any:
    """A subclass of diffusers' `base_name` with a LoRA loader (see the module docstring)."""
    import diffusers
    from diffusers.guiders import ClassifierFreeGuidance
    from diffusers.loaders import HunyuanVideoLoraLoaderMixin

    base = getattr(diffusers, base_name)

    class HunyuanVideo15ValidationPipeline(VideoPipeline, base,  # type: ignore[misc, valid-type]
                                           HunyuanVideoLoraLoaderMixin):
        diffusers_class = base
        needs_image = sized_by_image = base_name == I2V_PIPELINE
        default_size = (848, 480)

        def __call__(self, *args: Any, guidance_scale: float | None = None,
                     num_frames: int = 1, **kwargs: Any) -> Any:
            if guidance_scale is not None:
                self.register_modules(guider=ClassifierFreeGuidance(
                    guidance_scale=guidance_scale))
            return super().__call__(*args, num_frames=num_frames,
                                    **unpacked_kwargs(self.transformer, kwargs))

    return HunyuanVideo15ValidationPipeline

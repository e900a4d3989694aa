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
- Image-to-video starts from the prompt's `image` (validation.control_images), or
  without one from i2v.synthetic_image sized by height/width, which that pipeline does
  not take (it sizes the video from the image and the model's target_size).
- The output reads like an image pipeline's: `.images` (each video's first frame) and
  `.frames` (each video's frames as PIL images, for the .mp4).
"""

from __future__ import annotations

import functools
from typing import Any

from core.models.families.hunyuan_video15.i2v import I2V_PIPELINE, synthetic_image
from core.models.families.hunyuan_video15.text import unpack

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
    from types import SimpleNamespace

    import diffusers
    from diffusers.guiders import ClassifierFreeGuidance
    from diffusers.loaders import HunyuanVideoLoraLoaderMixin
    from PIL import Image

    base = getattr(diffusers, base_name)
    needs_image = base_name == I2V_PIPELINE

    class HunyuanVideo15ValidationPipeline(base, HunyuanVideoLoraLoaderMixin):  # type: ignore[misc, valid-type]
        def __call__(self, *args: Any, guidance_scale: float | None = None,
                     num_frames: int = 1, **kwargs: Any) -> Any:
            if guidance_scale is not None:
                self.register_modules(guider=ClassifierFreeGuidance(
                    guidance_scale=guidance_scale))
            kwargs = unpacked_kwargs(self.transformer, kwargs)
            kwargs["output_type"] = "np"
            if needs_image:
                # The image-to-video pipeline sizes its video from the image and the
                # model's target_size, and takes no height/width: they shape the fixed
                # first image when none is given.
                width, height = kwargs.pop("width", None), kwargs.pop("height", None)
                if not args and kwargs.get("image") is None:
                    kwargs["image"] = synthetic_image(int(width or 848), int(height or 480))
            videos = super().__call__(*args, num_frames=num_frames, **kwargs).frames
            frames = [[Image.fromarray((f * 255).round().clip(0, 255).astype("uint8"))
                       for f in video] for video in videos]
            return SimpleNamespace(images=[v[0] for v in frames], frames=frames)

        def save_pretrained(self, save_directory: Any, **kwargs: Any) -> None:
            """Saved as a plain `base_name` (a merge's or full fine-tune's folder):
            model_index.json then names a class DiffusionPipeline.from_pretrained finds."""
            base(**self.components).save_pretrained(save_directory, **kwargs)

    return HunyuanVideo15ValidationPipeline

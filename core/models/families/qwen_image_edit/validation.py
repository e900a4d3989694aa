"""The validation pipelines of Qwen-Image-Edit: QwenImageEditPipeline and
QwenImageEditPlusPipeline run from precomputed embeddings, with no text encoder.

What the edit pipelines do with `image` when prompt_embeds are given (diffusers 0.42,
pipeline_qwenimage_edit.py __call__; _plus.py likewise): the image sets the reference size
(`calculate_dimensions` of 1024*1024 at the image's aspect ratio), is resized and
VAE-encoded at it (`prepare_latents` -> `_encode_vae_image`, posterior mode, normalised),
and `encode_prompt` returns the given embeddings untouched, so neither the text encoder nor
the processor is used: both may be None. The reference size is the validation image's
area here, not 1024x1024 (`reference_area`).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from typing import Any

EDIT = "QwenImageEditPipeline"
PLUS = "QwenImageEditPlusPipeline"


PIPELINE_AREA = 1024 * 1024  # the reference area both pipelines hard-code


@contextlib.contextmanager
def reference_area(pipeline: Any, height: int | None, width: int | None) -> Iterator[None]:
    """While a validation runs, the pipeline encodes its references at the validation
    image's area (height x width, each reference at its own aspect) instead of its fixed
    1024x1024: training fits every control to its target's bucket, so this is what the
    LoRA learnt from, and a 64-pixel validation of a tiny model then attends 16 reference
    tokens, not 4,096. Both pipelines size references through their module's
    `calculate_dimensions(1024 * 1024, ratio)`; calls for any other area (Plus's 384x384
    condition images) pass through. Validation runs one pipeline at a time."""
    import sys

    module = sys.modules[pipeline.__module__]
    original = module.calculate_dimensions
    if not height or not width:
        yield
        return

    def at_validation_area(target_area: int, ratio: float) -> Any:
        return original(height * width if target_area == PIPELINE_AREA else target_area, ratio)

    module.calculate_dimensions = at_validation_area
    try:
        yield
    finally:
        module.calculate_dimensions = original


@functools.cache
def validation_pipeline_class(name: str) -> Any:
    """`name` (EDIT or PLUS) whose `guidance_scale` is its true-CFG scale, built on first
    use (importing this module needs no diffusers)."""
    import diffusers

    from core.models.families.qwen_image.family import validation_call_kwargs

    base = getattr(diffusers, name)

    class QwenImageEditValidationPipeline(base):  # type: ignore[misc, valid-type]
        """Validation passes `guidance_scale`, one prompt's embeddings without a mask and,
        for each prompt, its control images as `image`. As QwenImageValidationPipeline
        (qwen_image/family.py): a model that is not guidance-distilled takes the scale as
        `true_cfg_scale`, and embeddings without a mask are one prompt's own tokens."""

        def __call__(self, image: Any = None, prompt: Any = None, *,
                     guidance_scale: float | None = None, **kwargs: Any) -> Any:
            if image is None:
                # The edit pipelines need an image (their __call__ reads image.size);
                # without one the same transformer samples text-to-image, as
                # QwenImagePipeline does (and as `predict` trains an item without controls).
                return self._text_to_image(prompt=prompt, guidance_scale=guidance_scale,
                                           **kwargs)
            if name == EDIT and isinstance(image, list):
                if len(image) > 1:
                    raise ValueError(
                        f"validation.control_images names {len(image)} images for one "
                        "prompt, but Qwen-Image-Edit (QwenImageEditPipeline) takes 1; a "
                        "Qwen-Image-Edit-2509/2511 model (QwenImageEditPlusPipeline) takes "
                        "up to 3")
                image = image[0]  # the plain pipeline resizes one image, not a list
            guidance_scale = validation_call_kwargs(self.transformer, guidance_scale, kwargs)
            with reference_area(base, kwargs.get("height"), kwargs.get("width")):
                return super().__call__(image=image, prompt=prompt,
                                        guidance_scale=guidance_scale, **kwargs)

        def _text_to_image(self, **kwargs: Any) -> Any:
            from core.models.families.qwen_image.family import _validation_pipeline_class

            pipe = _validation_pipeline_class()(
                transformer=self.transformer, scheduler=self.scheduler, vae=self.vae,
                text_encoder=self.text_encoder, tokenizer=self.tokenizer)
            pipe.set_progress_bar_config(disable=True)
            return pipe(**kwargs)

    return QwenImageEditValidationPipeline

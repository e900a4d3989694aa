"""Qwen-Image-Edit's `processor` component (transformers' Qwen2VLProcessor: the Qwen2.5-VL
image processor and the tokenizer), loadable without torchvision.

Why: in transformers 5 a Qwen2VLProcessor has a video processor, and
Qwen2VLVideoProcessor exists only with torchvision, which this project does not install;
so `Qwen2VLProcessor(...)` and `Qwen2VLProcessor.from_pretrained(...)` both fail, and with
them QwenImageEditPipeline.from_pretrained. The edit pipelines never give the processor
videos (`_get_qwen_prompt_embeds` passes text and images), so without torchvision this
module uses `Qwen2VLProcessor` less its video processor: the same image processor (the
PIL backend transformers falls back to), tokenizer, image-token expansion and __call__.
With torchvision the stock class is used. `load_processor` reads the model's processor/
folder with that class, and `load` hands it to the pipeline's from_pretrained.

The subclass is named and placed as transformers' Qwen2VLProcessor (`__module__`,
`__name__`): diffusers records a component by its class's module and name in
model_index.json, and transformers writes the name into processor_config.json, so every
folder saved with it (tiny:, a merged model) names the stock class, as the real
Qwen/Qwen-Image-Edit* folders do, and loads anywhere.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any


@functools.cache
def processor_class() -> Any:
    """Qwen2VLProcessor, or (without torchvision) its subclass without a video processor."""
    from transformers import Qwen2VLProcessor
    from transformers.processing_utils import ProcessorMixin
    from transformers.utils import is_torchvision_available

    if is_torchvision_available():
        return Qwen2VLProcessor

    class Qwen2VLImageOnlyProcessor(Qwen2VLProcessor):
        """Qwen2VLProcessor.__init__ without the video processor: ProcessorMixin reads its
        sub-processors from this signature, so it neither builds nor loads one."""

        def __init__(self, image_processor: Any = None, tokenizer: Any = None,
                     chat_template: Any = None, **kwargs: Any) -> None:
            # The attributes Qwen2VLProcessor.__init__ sets before ProcessorMixin's.
            self.image_token = getattr(tokenizer, "image_token", "<|image_pad|>")
            self.video_token = getattr(tokenizer, "video_token", "<|video_pad|>")
            self.image_token_id = tokenizer.convert_tokens_to_ids(self.image_token)
            self.video_token_id = tokenizer.convert_tokens_to_ids(self.video_token)
            ProcessorMixin.__init__(self, image_processor, tokenizer,
                                    chat_template=chat_template, **kwargs)

        def save_pretrained(self, save_directory: Any, *args: Any, **kwargs: Any) -> Any:
            """Also the sub-processor files the real processor/ folders carry, so the
            folder loads where torchvision is installed (see write_processor_files)."""
            saved = super().save_pretrained(save_directory, *args, **kwargs)
            write_processor_files(Path(save_directory))
            return saved

    # Saved as the stock class (see the module docstring).
    Qwen2VLImageOnlyProcessor.__module__ = Qwen2VLProcessor.__module__
    Qwen2VLImageOnlyProcessor.__name__ = Qwen2VLImageOnlyProcessor.__qualname__ = (
        Qwen2VLProcessor.__name__)
    return Qwen2VLImageOnlyProcessor


# Qwen2VLVideoProcessor's own settings (transformers' class defaults, as the real
# Qwen/Qwen-Image-Edit* processor/video_preprocessor_config.json holds them); the sizes,
# patching and normalisation are the image processor's, as in those files.
VIDEO_DEFAULTS = {"do_sample_frames": False, "min_frames": 4, "max_frames": 768,
                  "video_processor_type": "Qwen2VLVideoProcessor"}
SHARED_WITH_VIDEO = ("do_convert_rgb", "do_normalize", "do_rescale", "do_resize",
                     "image_mean", "image_std", "merge_size", "patch_size", "resample",
                     "rescale_factor", "size", "temporal_patch_size")


def write_processor_files(folder: Path) -> None:
    """Beside transformers 5's processor_config.json (the image processor nested in it),
    the files the real processor/ folders carry: preprocessor_config.json (the image
    processor, which transformers 4 reads) and video_preprocessor_config.json. The
    processor without torchvision has no video part to save, yet with torchvision
    Qwen2VLProcessor.from_pretrained (and so DiffusionPipeline.from_pretrained) refuses a
    folder without one of these. Files already there are kept."""
    config = json.loads((folder / "processor_config.json").read_text(encoding="utf-8"))
    image = config.get("image_processor")
    if not isinstance(image, dict):
        return
    named = {"processor_class": config.get("processor_class", "Qwen2VLProcessor")}
    size = image.get("size") or {}
    pixels = {"min_pixels": size.get("shortest_edge"), "max_pixels": size.get("longest_edge")}
    pixels = {k: v for k, v in pixels.items() if v is not None}
    video = {k: image[k] for k in SHARED_WITH_VIDEO if k in image}
    files = {"preprocessor_config.json": {**image, **pixels, **named},
             "video_preprocessor_config.json": {**video, **pixels, **VIDEO_DEFAULTS, **named}}
    for name, content in files.items():
        if not (folder / name).exists():
            (folder / name).write_text(json.dumps(content, indent=2, sort_keys=True) + "\n",
                                       encoding="utf-8")


def new_processor(tokenizer: Any, image_processor: dict[str, Any],
                  chat_template: str | None = None) -> Any:
    """A processor over `tokenizer` with a Qwen2VLImageProcessor of these settings (and,
    with torchvision, Qwen2VLVideoProcessor's defaults)."""
    from transformers import Qwen2VLImageProcessor

    cls = processor_class()
    parts: dict[str, Any] = {"image_processor": Qwen2VLImageProcessor(**image_processor),
                             "tokenizer": tokenizer, "chat_template": chat_template}
    if "video_processor" in cls.get_attributes():
        from transformers import Qwen2VLVideoProcessor

        parts["video_processor"] = Qwen2VLVideoProcessor()
    return cls(**parts)


def load_processor(path: str, local_only: bool) -> Any:
    """The processor/ folder of a diffusers folder or hub id."""
    return processor_class().from_pretrained(path, subfolder="processor",
                                             local_files_only=local_only)


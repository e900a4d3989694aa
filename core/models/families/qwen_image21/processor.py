"""Qwen-Image 2.1's `processor` component (transformers' Qwen3VLProcessor: the image
processor and the tokenizer), loadable without torchvision.

Why: as with Qwen-Image-Edit's Qwen2VLProcessor (qwen_image_edit/processor.py), a
Qwen3VLProcessor in transformers 5 carries a video processor that exists only with
torchvision, which this project does not install; so both `Qwen3VLProcessor(...)` and
`QwenImage21Pipeline.from_pretrained` fail without it. QwenImage21Pipeline never gives
the processor videos (its `_get_qwen_prompt_embeds` passes text, and images only for an
image-conditioned call), so without torchvision this module uses Qwen3VLProcessor less
its video processor, named and placed as the stock class (saved folders name
Qwen3VLProcessor, as the real Qwen/Qwen-Image-2.1 one does). With torchvision the stock
class is used.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

# Qwen/Qwen3-VL-8B-Instruct's preprocessor (Qwen3-VL: 16-pixel patches, 2x2 merge,
# mean/std 0.5; transformers' Qwen3-VL defaults). Only image-conditioned calls read it.
VL_IMAGE_PROCESSOR = {"patch_size": 16, "temporal_patch_size": 2, "merge_size": 2,
                      "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5],
                      "size": {"shortest_edge": 65536, "longest_edge": 16777216}}
VIDEO_PROCESSOR_TYPE = "Qwen3VLVideoProcessor"


@functools.cache
def processor_class() -> Any:
    """Qwen3VLProcessor, or (without torchvision) its subclass without a video processor."""
    from transformers import Qwen3VLProcessor
    from transformers.processing_utils import ProcessorMixin
    from transformers.utils import is_torchvision_available

    if is_torchvision_available():
        return Qwen3VLProcessor

    class Qwen3VLImageOnlyProcessor(Qwen3VLProcessor):
        """Qwen3VLProcessor.__init__ without the video processor: ProcessorMixin reads its
        sub-processors from this signature, so it neither builds nor loads one."""

        def __init__(self, image_processor: Any = None, tokenizer: Any = None,
                     chat_template: Any = None, **kwargs: Any) -> None:
            # The token attributes Qwen3VLProcessor.__init__ sets around ProcessorMixin's.
            for kind in ("image", "video", "vision_start", "vision_end"):
                token = getattr(tokenizer, f"{kind}_token", None) or _TOKENS[kind]
                setattr(self, f"{kind}_token", token)
                setattr(self, f"{kind}_token_id", tokenizer.convert_tokens_to_ids(token))
            ProcessorMixin.__init__(self, image_processor, tokenizer,
                                    chat_template=chat_template, **kwargs)

        def save_pretrained(self, save_directory: Any, *args: Any, **kwargs: Any) -> Any:
            """Also the sub-processor files the real processor/ folder carries, so the
            folder loads where torchvision is installed."""
            saved = super().save_pretrained(save_directory, *args, **kwargs)
            write_processor_files(Path(save_directory))
            return saved

    Qwen3VLImageOnlyProcessor.__module__ = Qwen3VLProcessor.__module__
    Qwen3VLImageOnlyProcessor.__name__ = Qwen3VLImageOnlyProcessor.__qualname__ = (
        Qwen3VLProcessor.__name__)
    return Qwen3VLImageOnlyProcessor


_TOKENS = {"image": "<|image_pad|>", "video": "<|video_pad|>",
           "vision_start": "<|vision_start|>", "vision_end": "<|vision_end|>"}


def write_processor_files(folder: Path) -> None:
    """preprocessor_config.json and video_preprocessor_config.json beside
    processor_config.json (qwen_image_edit's writer), the video one naming Qwen3-VL's
    video processor."""
    from core.models.families.qwen_image_edit.processor import (
        write_processor_files as write_files,
    )

    video = folder / "video_preprocessor_config.json"
    existed = video.exists()
    write_files(folder)
    if video.exists() and not existed:
        config = json.loads(video.read_text(encoding="utf-8"))
        config["video_processor_type"] = VIDEO_PROCESSOR_TYPE
        video.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def new_processor(tokenizer: Any, chat_template: str) -> Any:
    """A processor over `tokenizer` with Qwen3-VL's image processor settings."""
    from transformers import Qwen2VLImageProcessor

    cls = processor_class()
    parts: dict[str, Any] = {"image_processor": Qwen2VLImageProcessor(**VL_IMAGE_PROCESSOR),
                             "tokenizer": tokenizer, "chat_template": chat_template}
    if "video_processor" in cls.get_attributes():
        from transformers import Qwen3VLVideoProcessor

        parts["video_processor"] = Qwen3VLVideoProcessor()
    return cls(**parts)


def load_processor(path: str, local_only: bool) -> Any:
    """The processor/ folder of a diffusers folder or hub id."""
    return processor_class().from_pretrained(path, subfolder="processor",
                                             local_files_only=local_only)

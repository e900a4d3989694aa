"""core/models/video_pipeline.py, the video families' shared validation glue, on a stand-in
for a diffusers pipeline class: the output, the synthetic first image and save_pretrained
as the plain class. No diffusers, no model: fast."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import numpy as np
import torch

from core.models.video_pipeline import VideoPipeline, pixels_to_pil, synthetic_image


class StandIn:
    """What VideoPipeline reads of a diffusers pipeline: its components, its call (numpy
    frames) and save_pretrained, which records the class it saved as."""

    saved: list[type] = []

    def __init__(self, **modules: Any) -> None:
        self.modules, self.calls = modules, []

    @property
    def components(self) -> dict[str, Any]:
        return self.modules

    def __call__(self, *args: Any, num_frames: int = 1, **kwargs: Any) -> Any:
        self.calls.append(kwargs)
        return SimpleNamespace(frames=np.full((2, num_frames, 4, 6, 3), 0.5, np.float32))

    def save_pretrained(self, save_directory: Any, **kwargs: Any) -> None:
        StandIn.saved.append(type(self))


class TextToVideo(VideoPipeline, StandIn):
    diffusers_class = StandIn


class ImageToVideo(VideoPipeline, StandIn):
    diffusers_class = StandIn
    needs_image = True
    default_size = (10, 8)


class SizedByImage(ImageToVideo):
    sized_by_image = True


def test_the_output_reads_like_an_image_pipelines() -> None:
    pipe = TextToVideo(transformer="t")
    out = pipe(prompt="p", num_frames=3)
    assert pipe.calls == [{"prompt": "p", "output_type": "np"}]
    assert [len(video) for video in out.frames] == [3, 3]
    assert out.images == [video[0] for video in out.frames]
    assert out.images[0].size == (6, 4) and out.images[0].getpixel((0, 0)) == (128, 128, 128)


def test_an_image_to_video_call_without_an_image_starts_from_the_synthetic_one() -> None:
    pipe = ImageToVideo()
    pipe(prompt="p", width=16)
    image = pipe.calls[0]["image"]
    assert image.size == (16, 8) and pipe.calls[0]["width"] == 16  # height: the default
    assert np.array_equal(np.asarray(image), np.asarray(synthetic_image(16, 8)))
    given = synthetic_image(4, 4)
    pipe(prompt="p", image=given)
    assert pipe.calls[1]["image"] is given
    sized = SizedByImage()
    sized(prompt="p", width=12, height=6)
    assert sized.calls[0]["image"].size == (12, 6)
    assert "width" not in sized.calls[0] and "height" not in sized.calls[0]


def test_save_pretrained_writes_the_plain_class() -> None:
    StandIn.saved.clear()
    ImageToVideo(transformer="t").save_pretrained("folder")
    assert StandIn.saved == [StandIn]


def test_pixels_go_back_to_the_8_bit_images_they_came_from() -> None:
    image = synthetic_image(6, 4)
    pixels = torch.from_numpy(np.array(image)).permute(2, 0, 1)[None].float() / 127.5 - 1
    assert np.array_equal(np.asarray(pixels_to_pil(pixels)[0]), np.asarray(image))

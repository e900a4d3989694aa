"""What the video families' validation pipelines share: `VideoPipeline`, mixed in before
diffusers' pipeline class by each video family's pipelines.py, so the glue between a
diffusers video pipeline and the shared validation is written once.

- The call returns what the shared validation reads of an image pipeline: `.images`
  (each video's first frame, what the gallery and the grid show) and `.frames` (each
  video's frames as PIL images, for the .mp4); a family adds its own (`video_output`).
- `pixels_to_pil`: a clip's first frames as the images an image-to-video model's image
  encoder reads (training's side of the same glue).
- An image-to-video pipeline called without an `image` starts from `synthetic_image`,
  a fixed first image sized by the call's width and height: the config names no first
  image for that validation prompt.
- `save_pretrained` writes the plain diffusers class (a merge's or a full fine-tune's
  folder): model_index.json then names a class DiffusionPipeline.from_pretrained finds,
  not the family's subclass.

Importing this module needs no diffusers.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, ClassVar


def synthetic_image(width: int, height: int) -> Any:
    """The fixed first image image-to-video validation starts from where
    validation.control_images names none: a left-to-right red-to-blue gradient with a
    white square in the middle, so a LoRA's motion shows against a known start."""
    import numpy as np
    from PIL import Image

    ramp = np.linspace(0.0, 1.0, width, dtype=np.float32)[None, :].repeat(height, axis=0)
    rgb = np.stack([1.0 - ramp, 0.2 * np.ones_like(ramp), ramp], axis=-1)
    top, left = height // 3, width // 3
    rgb[top:height - top, left:width - left] = 1.0
    return Image.fromarray((rgb * 255).round().astype(np.uint8))


def pil_frames(videos: Any) -> list[list[Any]]:
    """Each video's frames (a pipeline's output_type="np" frames, floats in [0, 1]) as
    8-bit PIL images."""
    from PIL import Image

    return [[Image.fromarray((f * 255).round().clip(0, 255).astype("uint8")) for f in video]
            for video in videos]


def pixels_to_pil(pixels: Any) -> list[Any]:
    """Pixels [B, 3, H, W] in [-1, 1] (from 8-bit images: a clip's first frames) as the
    PIL images an image-to-video model's image processor is given."""
    import numpy as np
    from PIL import Image

    array = ((pixels.float().cpu().clamp(-1, 1) + 1) * 127.5).round().byte()
    return [Image.fromarray(np.ascontiguousarray(a.permute(1, 2, 0).numpy())) for a in array]


def video_output(frames: list[list[Any]], **extra: Any) -> SimpleNamespace:
    """The call's result: `.images` (each video's first frame), `.frames`, and `extra`."""
    return SimpleNamespace(images=[video[0] for video in frames], frames=frames, **extra)


class VideoPipeline:
    """The mixin (first among the bases, diffusers' pipeline class after it). A family's
    subclass sets the class attributes; its own `__call__`, where it has one, ends in
    `sampled` or in this `__call__`."""

    diffusers_class: ClassVar[type]  # the diffusers pipeline class it subclasses
    needs_image: ClassVar[bool] = False  # an image-to-video pipeline
    default_size: ClassVar[tuple[int, int]] = (832, 480)  # the first image's, unsized
    # The pipeline takes no width/height (it sizes the video from the image): they size
    # the synthetic first image only, and are not passed on.
    sized_by_image: ClassVar[bool] = False

    def __call__(self, *args: Any, num_frames: int = 1, **kwargs: Any) -> Any:
        return video_output(self.sampled(*args, num_frames=num_frames, **kwargs)[1])

    def sampled(self, *args: Any, num_frames: int = 1, **kwargs: Any) -> tuple[Any, Any]:
        """diffusers' call as numpy frames, from the synthetic first image where an
        image-to-video call names none: (its output, its frames as PIL images)."""
        kwargs["output_type"] = "np"
        self._first_image(args, kwargs)
        out = super().__call__(*args, num_frames=num_frames, **kwargs)  # type: ignore[misc]
        return out, pil_frames(out.frames)

    def _first_image(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        if not self.needs_image:
            return
        size = (kwargs.pop("width", None), kwargs.pop("height", None)) \
            if self.sized_by_image else (kwargs.get("width"), kwargs.get("height"))
        if not args and kwargs.get("image") is None:
            width, height = (int(given or default)
                             for given, default in zip(size, self.default_size, strict=True))
            kwargs["image"] = synthetic_image(width, height)

    def save_pretrained(self, save_directory: Any, **kwargs: Any) -> None:
        """Saved as the plain diffusers class (see the module docstring)."""
        modules = self.components  # type: ignore[attr-defined]
        self.diffusers_class(**modules).save_pretrained(save_directory, **kwargs)

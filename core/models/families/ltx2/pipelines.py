"""The LTX-2 validation pipelines: LTX2Pipeline (text-to-video) or
LTX2ImageToVideoPipeline (image-to-video, i2v.py) sampling from the cached text (text.py)
and returning frames as the shared validation reads them (built on first use, so
importing this module needs no diffusers)."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from typing import Any

I2V_PIPELINE = "LTX2ImageToVideoPipeline"


@functools.cache
def validation_pipeline_class(base_name: str = "LTX2Pipeline") -> Any:
    """A subclass of diffusers' `base_name`, LTX2Pipeline or LTX2ImageToVideoPipeline
    (see its docstring)."""
    from types import SimpleNamespace

    import diffusers
    import torch
    from PIL import Image

    from core.models.families.ltx2.i2v import synthetic_image
    from core.models.families.ltx2.text import split
    from core.models.families.ltx2.versions import suggested_guidance, video_text_width

    class CachedText(torch.nn.Module):
        """Stands in for LTX2TextConnectors while the pipeline samples from cached
        connector outputs: gives their two halves and the mask back as they are. It
        says the transformer's device and dtype, where the pipeline asks a module."""

        def __init__(self, video_dim: int, device: Any, dtype: Any) -> None:
            super().__init__()
            self.video_dim, self.device, self.dtype = video_dim, device, dtype

        def forward(self, embeds: Any, mask: Any, padding_side: str = "left") -> Any:
            video, audio = split(embeds, self.video_dim)
            return video, audio, mask

    base = getattr(diffusers, base_name)
    needs_image = base_name == I2V_PIPELINE

    class LTX2ValidationPipeline(base):  # type: ignore[misc, valid-type]
        """Takes `prompt_embeds` / `prompt_attention_mask` (and the negatives) as
        text.py caches them: the connectors already ran, so they are set aside for the
        call (the real ones stay the pipeline's component, for merge and saving). The
        audio VAE and the vocoder join the transformer's device for the call. Returns
        `.images` (each video's first frame), `.frames` (PIL frames), `.audio`
        ([B, channels, samples]) and `.audio_sample_rate`. Image-to-video without an
        `image` starts from i2v.synthetic_image: the config names no first image for the
        prompt."""

        def __call__(self, *args: Any, num_frames: int = 1, **kwargs: Any) -> Any:
            kwargs["output_type"] = "np"
            # LTX-2.3: its suggested audio CFG, STG and modality guidance (versions.py)
            kwargs = {**suggested_guidance(self.transformer.config,
                                           kwargs.get("guidance_scale")), **kwargs}
            if needs_image and not args and kwargs.get("image") is None:
                kwargs["image"] = synthetic_image(int(kwargs.get("width") or 768),
                                                  int(kwargs.get("height") or 512))
            with self._cached_text(), self._audio_on(self.transformer.device):
                out = super().__call__(*args, num_frames=num_frames, **kwargs)
            frames = [[Image.fromarray((f * 255).round().clip(0, 255).astype("uint8"))
                       for f in video] for video in out.frames]
            rate = int(self.vocoder.config.output_sampling_rate)
            return SimpleNamespace(images=[v[0] for v in frames], frames=frames,
                                   audio=out.audio.float().cpu(), audio_sample_rate=rate)

        @contextlib.contextmanager
        def _cached_text(self) -> Iterator[None]:
            real = self.connectors
            dim = video_text_width(self.transformer.config)
            stand_in = CachedText(dim, self.transformer.device, self.transformer.dtype)
            object.__setattr__(self, "connectors", stand_in)  # not a new component
            try:
                yield
            finally:
                object.__setattr__(self, "connectors", real)

        @contextlib.contextmanager
        def _audio_on(self, device: Any) -> Iterator[None]:
            homes = [(m, next(m.parameters()).device) for m in (self.audio_vae, self.vocoder)]
            for module, _ in homes:
                module.to(device)
            try:
                yield
            finally:
                for module, home in homes:
                    module.to(home)

    return LTX2ValidationPipeline

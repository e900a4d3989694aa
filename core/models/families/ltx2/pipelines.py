"""The LTX-2 validation pipelines: LTX2Pipeline (text-to-video) or
LTX2ImageToVideoPipeline (image-to-video, i2v.py) sampling from the cached text (text.py),
with the video families' shared glue (core/models/video_pipeline.py: the output, the
synthetic first image, save_pretrained) and the audio beside the frames (built on first
use, so importing this module needs no diffusers)."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from typing import Any

from core.models.video_pipeline import VideoPipeline, video_output

I2V_PIPELINE = "LTX2ImageToVideoPipeline"


@functools.cache
def validation_pipeline_class(base_name: str = "LTX2Pipeline") -> Any:
    """A subclass of diffusers' `base_name`, LTX2Pipeline or LTX2ImageToVideoPipeline
    (see its docstring)."""
    import diffusers
    import torch

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

    class LTX2ValidationPipeline(VideoPipeline, base):  # type: ignore[misc, valid-type]
        """Takes `prompt_embeds` / `prompt_attention_mask` (and the negatives) as
        text.py caches them: the connectors already ran, so they are set aside for the
        call (the real ones stay the pipeline's component, for merge and saving). The
        audio VAE and the vocoder join the transformer's device for the call. Returns
        `.audio` ([B, channels, samples]) and `.audio_sample_rate` beside the frames."""

        diffusers_class = base
        needs_image = base_name == I2V_PIPELINE
        default_size = (768, 512)

        def __call__(self, *args: Any, num_frames: int = 1, **kwargs: Any) -> Any:
            # LTX-2.3: its suggested audio CFG, STG and modality guidance (versions.py)
            kwargs = {**suggested_guidance(self.transformer.config,
                                           kwargs.get("guidance_scale")), **kwargs}
            with self._cached_text(), self._audio_on(self.transformer.device):
                out, frames = self.sampled(*args, num_frames=num_frames, **kwargs)
            rate = int(self.vocoder.config.output_sampling_rate)
            return video_output(frames, audio=out.audio.float().cpu(), audio_sample_rate=rate)

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

"""What a family's VAE and denoiser do to a sample's shape (`Geometry`, the family's
`geometry` member): shared code (the frame checks, the memory estimate, the cache plan,
the clip reader) reads these and names no family's rule of its own.

The numbers are the real model's; `vae_geometry` reads the same three from a VAE config,
and tests/test_geometry.py holds every family's declaration to its full_size/ configs."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Geometry:
    # Samples may be clips with a frame axis (datasets.N.frames, validation.frames).
    video: bool = False
    # A clip holds frame_step * k + 1 frames (Wan's VAE: 4, LTX-2's: 8); 1: any count.
    frame_step: int = 1
    # Frames packed into one latent frame after the first, which the VAE keeps alone.
    temporal_compression: int = 1
    spatial_compression: int = 8  # pixels per latent side
    latent_channels: int = 4
    # Pixel sides a sample must be a multiple of (the VAE's factor times the patch the
    # denoiser packs); bucket sides (data/buckets.py) are multiples of 64, which it
    # divides.
    spatial_multiple: int = 16
    # The frame rate its models are trained at and its pipeline samples at: a dataset's
    # clips are resampled to it and validation videos play at it unless the config
    # says otherwise (datasets.N.fps, validation.fps = 0). None: stills.
    fps: float | None = None

    def valid_frames(self, frames: int) -> bool:
        """Whether a clip of `frames` frames fits the VAE's frame rule."""
        return frames >= 1 and (frames - 1) % self.frame_step == 0

    def latent_frames(self, frames: int) -> int:
        """Latent frames of a clip of `frames` frames: the first alone, then one per
        temporal_compression frames."""
        return 1 + max(frames - 1, 0) // self.temporal_compression

    def frame_rule(self) -> str:
        """"4k + 1" (or "any count")."""
        return "any count" if self.frame_step == 1 else f"{self.frame_step}k + 1"

    def frames_hint(self, frames: int) -> str:
        """Why `frames` is refused and the nearest counts that work, for a check message."""
        step = self.frame_step
        below = (frames - 1) // step * step + 1
        choices = f"{below} or {below + step}" if below >= 1 else "1"
        examples = ", ".join(str(step * k + 1) for k in range(5))
        return (f"{frames} frames is not {self.frame_rule()} ({examples}, ...; the VAE keeps "
                f"the first frame and packs each further {self.temporal_compression} into "
                f"one latent); use {choices}")


STILLS = Geometry()


def vae_geometry(config: dict[str, Any]) -> tuple[int, int, int]:
    """(latent channels, spatial compression, temporal compression) a diffusers VAE
    config says: a 2D AutoencoderKL halves per level after the first; a causal video VAE
    names its factors or halves per level in space (Wan's, Qwen-Image's) and doubles per
    `temperal_downsample` level that is on in time."""
    channels = int(config.get("latent_channels") or config.get("z_dim") or 4)
    levels = len(config.get("block_out_channels") or config.get("dim_mult") or (0,) * 4)
    # diffusers names the factors scale_factor_* in some VAE configs and *_compression_ratio
    # in others, where a config states them.
    spatial = int(config.get("scale_factor_spatial") or config.get("spatial_compression_ratio")
                  or 2 ** (levels - 1))
    downsample = config.get("temperal_downsample")
    temporal = int(config.get("scale_factor_temporal")
                   or config.get("temporal_compression_ratio")
                   or (2 ** sum(bool(d) for d in downsample) if downsample else 1))
    return channels, spatial, temporal

"""The largest step a run takes, as the memory estimate reckons it: its pixels, its
frames (a video family's clips) and its shape in latents (core/memory/estimate.py)."""

from __future__ import annotations

import math
from dataclasses import replace
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from core.config import Config
    from core.memory.activations import StepShape
    from core.memory.model_counts import ModelSizes

FP32 = 4


def step_pixels(cfg: Config, buckets: list[tuple[int, int]] | None = None
                ) -> tuple[int, int]:
    """(width, height) of the largest step the run takes: the largest of `buckets`
    (the run's own), else the largest dataset's square bucket; 512 without datasets."""
    from core.data.buckets import effective_resolution

    if buckets:
        return max(buckets, key=lambda b: (b[0] * b[1], b))
    side = max((effective_resolution(ds.resolution) for ds in cfg.datasets), default=512)
    return side, side


def step_shape(cfg: Config, sizes: ModelSizes, pixels: tuple[int, int] | None = None
               ) -> StepShape:
    """The largest step (`pixels`, else step_pixels(cfg)) in latents, the batch and
    dtype."""
    from core.memory.activations import StepShape
    from core.models.geometry import vae_geometry
    from core.models.registry import family_or_defaults

    width, height = pixels or step_pixels(cfg)
    geometry = family_or_defaults(cfg.model.family).geometry
    # The loaded model's VAE config says its factors (Wan 2.2 TI2V-5B's 16, where Wan's
    # family declares 8); without one, the family's.
    if sizes.vae:
        _, scale, temporal = vae_geometry(sizes.vae.config)
    else:
        scale, temporal = geometry.spatial_compression, geometry.temporal_compression
    frames = replace(geometry, temporal_compression=temporal).latent_frames(step_frames(cfg))
    half = cfg.train.mixed_precision in ("fp16", "bf16")
    return StepShape(math.ceil(height / scale), math.ceil(width / scale),
                     cfg.train.batch_size, 2 if half else FP32,
                     cfg.train.gradient_checkpointing, frames, 1 + step_controls(cfg))


def step_controls(cfg: Config) -> int:
    """Control images per sample an edit family joins to the target's tokens: the most
    any dataset gives (datasets.N.control, control_2, ...), else 0."""
    from core.data.controls import control_folders
    from core.models.registry import family_or_defaults

    if not family_or_defaults(cfg.model.family).edit:
        return 0
    return max((len(control_folders(ds)) for ds in cfg.datasets), default=0)


def step_frames(cfg: Config) -> int:
    """Frames in the largest sample: a video family's longest datasets.N.frames, else 1."""
    from core.models.registry import family_or_defaults

    video = family_or_defaults(cfg.model.family).video
    return max((ds.frames for ds in cfg.datasets), default=1) if video else 1


def shape_text(pixels: tuple[int, int], shape: StepShape, frames: int = 1) -> str:
    on = "on" if shape.checkpointing else "off"
    clip = f", {frames} frames" if frames > 1 else ""
    controls = shape.image_sequences - 1
    control = f" + {controls} control image{'s' if controls > 1 else ''}" if controls else ""
    return (f"{pixels[0]}x{pixels[1]}{clip}{control}, batch {shape.batch}, gradient "
            f"checkpointing {on}")


# The most latent channels a family's prediction has (FLUX.2's packed 128).
PREDICTION_CHANNELS = 128


def base_output_name(cfg: Config) -> str:
    """The memory line's name for preserve_bytes' part."""
    if any(ds.preserve for ds in cfg.datasets):
        return "preserved base output"
    return "unconditional base output"


def preserve_bytes(cfg: Config, shape: StepShape) -> int:
    """What datasets.N.preserve or train.guidance_target_scale adds to a step: the extra
    forward runs without a graph (each block's activations are freed as the next runs,
    before the trained forward starts), so what stays is the base's prediction in fp32,
    the target or the unconditional prediction (a batch takes one or the other); 0 when
    neither is on."""
    if not any(ds.preserve for ds in cfg.datasets) and cfg.train.guidance_target_scale <= 0:
        return 0
    return (shape.batch * shape.latent_frames * shape.latent_height * shape.latent_width
            * PREDICTION_CHANNELS * FP32)

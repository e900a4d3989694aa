"""What a loaded model is (`Components`) and one noised batch (`NoiseSample`): the two
values every family's functions pass around (core/models/base.py describes the tensors)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, TypeVar


@dataclass
class Components:
    """A loaded model: everything training, caching and validation need."""

    family: str
    source: str  # the path or hub id it was loaded from
    fingerprint: str  # stable id of the weights, recorded in caches
    vae: Any
    denoiser: Any  # UNet2DConditionModel, SD3Transformer2DModel or FluxTransformer2DModel
    text_encoders: list[Any]
    tokenizers: list[Any]
    noise_scheduler: Any
    # A family's own settings are fields of its Components subclass, in its folder (set
    # by `load` and `random.settings`, read by that family only; a test may change them).
    flow: Any = None  # flow families: objectives.FlowTraining of the run (None: defaults)
    denoiser_stream: Any = None  # a meta-device denoiser filled where it runs (stream_load.py)


@dataclass
class GuidedComponents(Components):
    """A guidance-distilled family's model (its `train_guidance` set): the guidance value
    its denoiser is given in training, which train.guidance sets (None: the family's
    `train_guidance`)."""

    guidance: float | None = None


C = TypeVar("C", bound=Components)


def extended(c: Components, cls: type[C], **own: Any) -> C:
    """`c`'s shared fields as the family's Components subclass `cls`, with its own
    fields `own` (the rest at their defaults)."""
    shared = {f.name: getattr(c, f.name) for f in dataclasses.fields(Components)}
    return cls(**shared, **own)


@dataclass
class NoiseSample:
    noisy: Any  # model input latents
    timesteps: Any  # what the denoiser is given
    target: Any  # what its output is compared with
    weights: Any | None = None  # per-item loss weights, or None for uniform
    mask: Any | None = None  # [B, 1, H, W] loss mask (datasets.N.masks), or None

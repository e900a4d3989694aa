"""What a loaded model is (`Components`) and one noised batch (`NoiseSample`): the two
values every family's functions pass around (core/models/base.py describes the tensors)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


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
    # Per-family settings, set by `load`, read by that family only (a test may change them).
    max_sequence_length: int | None = None  # sd3/flux: T5 tokens the text is padded to
    has_t5: bool = False  # sd3: whether the T5 encoder was loaded (it may be left out)
    guidance: float | None = None  # flux: guidance value given to a distilled model
    pipeline_class: str | None = None  # flux2: Flux2KleinPipeline or Flux2Pipeline (dev)
    is_distilled: bool = False  # flux2: a step-distilled klein (model_index.json)
    flow: Any = None  # flow families: objectives.FlowTraining of the run (None: defaults)
    companion: Any = None  # ideogram4: the frozen unconditional transformer validation loads
    denoiser_stream: Any = None  # a meta-device denoiser filled where it runs (stream_load.py)


@dataclass
class NoiseSample:
    noisy: Any  # model input latents
    timesteps: Any  # what the denoiser is given
    target: Any  # what its output is compared with
    weights: Any | None = None  # per-item loss weights, or None for uniform
    mask: Any | None = None  # [B, 1, H, W] loss mask (datasets.N.masks), or None

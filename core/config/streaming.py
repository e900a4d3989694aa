"""Whether the trainer streams the denoiser to where it runs (core/models/stream_load.py)
or loads it whole on the CPU first, as the config alone decides; the trainer and the
memory estimate's host line both read it."""

from __future__ import annotations

import inspect

from core.config.schema import Config
from core.models.registry import family_or_defaults
from core.models.source import model_source

STREAMED_SCHEMES = ("none", "int8", "fp8")


def stream_fallback(cfg: Config) -> str | None:
    """Why the denoiser is loaded whole into host memory before it is placed (the path
    every source had before streaming), or None when it streams layer by layer."""
    kind = model_source(cfg.model.path).kind
    if kind not in ("random", "folder", "tiny"):  # tiny:<name> is a diffusers folder
        return (f"model.path is a {kind} source; the streamed load covers random: models "
                "and diffusers folders")
    if kind != "random" and not loads_given_denoiser(cfg.model.family):
        return f"the {cfg.model.family} loader reads its denoiser itself"
    if cfg.train.method != "lora":
        return "a full fine-tune trains every weight in float32 from the CPU"
    if cfg.model.training_adapter:
        return "model.training_adapter is fused into the whole denoiser before it is placed"
    if cfg.model.quantize not in STREAMED_SCHEMES:
        return (f"model.quantize = \"{cfg.model.quantize}\" puts bitsandbytes' own layers "
                "in place of the model's")
    return None


def loads_given_denoiser(family: str) -> bool:
    """Whether the family's `load` takes a folder's denoiser built already (FlowFamily's
    `denoiser`: the families that load through it, not those with a loader of their own
    such as Wan's two experts)."""
    load = getattr(family_or_defaults(family), "load", None)
    return load is not None and "denoiser" in inspect.signature(load).parameters

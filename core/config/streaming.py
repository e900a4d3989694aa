"""Whether the trainer streams the denoiser to where it runs (core/models/stream_load.py)
or loads it whole on the CPU first, as the config alone decides; the trainer and the
memory estimate's host line both read it."""

from __future__ import annotations

from core.config.schema import Config
from core.models.source import model_source

STREAMED_SCHEMES = ("none", "int8", "fp8")


def stream_fallback(cfg: Config) -> str | None:
    """Why the denoiser is loaded whole into host memory before it is placed (the path
    every source had before streaming), or None when it streams layer by layer."""
    kind = model_source(cfg.model.path).kind
    if kind != "random":
        # A diffusers folder's safetensors could stream the same way; not built yet.
        return f"model.path is a {kind} source; the streamed load covers random: models"
    if cfg.train.method != "lora":
        return "a full fine-tune trains every weight in float32 from the CPU"
    if cfg.model.quantize not in STREAMED_SCHEMES:
        return (f"model.quantize = \"{cfg.model.quantize}\" puts bitsandbytes' own layers "
                "in place of the model's")
    return None

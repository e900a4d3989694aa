"""Moving collated batches to the device with the right dtypes."""

from __future__ import annotations

from typing import Any

FLOAT_KEYS = ("latents", "prompt_embeds", "pooled_prompt_embeds")


def to_device(batch: dict[str, Any], device: Any, dtype: Any) -> dict[str, Any]:
    """Float tensors to `dtype`; masks, size ids and lists keep their types."""
    import torch

    out: dict[str, Any] = {}
    for key, value in batch.items():
        if isinstance(value, torch.Tensor):
            value = value.to(device, dtype) if key in FLOAT_KEYS else value.to(device)
        out[key] = value
    return out

"""Moving collated batches to the device with the right dtypes."""

from __future__ import annotations

from typing import Any

FLOAT_KEYS = ("latents", "prompt_embeds", "pooled_prompt_embeds")


def to_device(batch: dict[str, Any], device: Any, dtype: Any) -> dict[str, Any]:
    """Float tensors to `dtype`; masks, size ids and lists keep their types. To a CUDA
    device from pinned memory without blocking: a copy from pageable memory makes the
    host wait for the device's queued work, a sync per step (core/train/stepping.py)."""
    import torch

    cuda = torch.device(device).type == "cuda"
    out: dict[str, Any] = {}
    for key, value in batch.items():
        if isinstance(value, torch.Tensor):
            if cuda and value.device.type == "cpu":
                value = value.pin_memory()
            to = (device, dtype) if key in FLOAT_KEYS else (device,)
            value = value.to(*to, non_blocking=cuda)
        out[key] = value
    return out

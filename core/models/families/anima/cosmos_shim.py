"""CosmosTransformer3DModel without torchvision, which this project does not install.

With `concat_padding_mask` (Anima's transformer has it) the model's forward resizes the
padding mask to the latents' size with torchvision's `transforms.functional.resize`
(nearest), and diffusers imports torchvision only when it is installed, so without it
every forward fails on a missing name. `ensure_padding_resize` gives the module a
stand-in holding just that: nearest resizing by torch's own interpolate, what
torchvision's resize does to a tensor in nearest mode. Anima's padding mask is all zeros
(the pipeline's, and the reference trainer's), so either way the channel is zeros."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any


def _resize(mask: Any, size: list[int], interpolation: Any = None, **_: Any) -> Any:
    import torch.nn.functional as F

    return F.interpolate(mask, size=list(size), mode="nearest")


def ensure_padding_resize() -> None:
    """Give diffusers' transformer_cosmos a `transforms` where torchvision is missing."""
    from diffusers.models.transformers import transformer_cosmos

    if getattr(transformer_cosmos, "transforms", None) is None:
        transformer_cosmos.transforms = SimpleNamespace(
            functional=SimpleNamespace(resize=_resize),
            InterpolationMode=SimpleNamespace(NEAREST="nearest"))

"""What every family does to its loaded torch modules: freeze them after loading, look
under the wrappers training puts around the denoiser, and encode images into latents.

Nothing heavy at module level: the trainer imports `unwrap` from here before it needs torch.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from core.models.objectives import standard_noise


def freeze(modules: Iterable[Any], device: Any) -> None:
    """Move loaded modules to `device`, frozen and in eval mode (the base.py contract);
    the trainer unfreezes what it trains. None (a missing optional part) is skipped."""
    for module in modules:
        if module is not None:
            module.to(device)
            module.requires_grad_(False)
            module.eval()


def unwrap(model: Any) -> Any:
    """The plain module under accelerate/DDP/torch.compile wrappers."""
    while True:
        inner = getattr(model, "module", None) or getattr(model, "_orig_mod", None)
        if inner is None:
            return model
        model = inner


def encode_latents(vae: Any, pixels: Any, generator: Any = None) -> Any:
    """Normalised latents of pixels in [-1, 1]: (z - shift_factor) * scaling_factor.

    Without a generator z is the posterior mean (deterministic caches); with one, a
    posterior sample, as diffusers' training scripts take. fp16 VAEs that ask for it
    (SDXL's overflows) encode in float32, as the pipelines' upcast_vae does for decoding.
    """
    import torch

    upcast = vae.dtype == torch.float16 and getattr(vae.config, "force_upcast", False)
    if upcast:
        vae.to(torch.float32)
    try:
        with torch.no_grad():
            dist = vae.encode(pixels.to(vae.device, vae.dtype)).latent_dist
            latents = dist.mean
            if generator is not None:
                noise = standard_noise(latents.shape, generator, latents.device)
                latents = latents + dist.std * noise.to(latents.dtype)
    finally:
        if upcast:
            vae.to(torch.float16)
    shift = getattr(vae.config, "shift_factor", None)
    if shift is not None:
        latents = latents - shift
    return (latents * vae.config.scaling_factor).to(vae.dtype)

"""What every family does to its loaded torch modules: freeze them after loading, look
under the wrappers training puts around the denoiser, and encode images into latents
(`vae_batch_size`: how many at once, which the cache builder and the memory estimate
both read).

Nothing heavy at module level: the trainer imports `unwrap` from here before it needs torch.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable, Iterator
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


def encoder_modules(c: Any) -> list[Any]:
    """The VAE and the text encoders that are loaded (an SD3 without T5 has a None)."""
    return [m for m in (c.vae, *c.text_encoders) if m is not None]


def move_encoders(c: Any, device: Any, stream: bool = False) -> None:
    """Text encoders and the VAE to `device`: onto the GPU while caches are built, back
    to the CPU once they are, so training holds only the denoiser there. `stream`
    (model.stream_text_encoders): the text encoders' repeated layers stay in host memory
    and come to `device` one at a time as they run (core/models/block_swap.py)."""
    from core.models.block_swap import stream_layers, unstream

    texts = {id(m) for m in c.text_encoders if m is not None}
    for module in encoder_modules(c):
        unstream(module)
        if stream and id(module) in texts:
            stream_layers(module, device)
        else:
            module.to(device)


def cast_encoders(c: Any, dtype: Any) -> None:
    """Text encoders and the VAE to `dtype` (a full fine-tune loads everything in fp32
    for its trainable denoiser; the frozen parts run in the mixed-precision dtype)."""
    for module in encoder_modules(c):
        module.to(dtype=dtype)


def release_device_memory(device: Any) -> None:
    """Give cached blocks back to the driver after modules left the GPU."""
    import torch

    if torch.device(device).type == "cuda":
        torch.cuda.empty_cache()


def avoid_cudnn_attention() -> None:
    """Take cuDNN out of the kernels scaled_dot_product_attention picks from, for this
    process: flash and memory-efficient attention (then the plain maths) take over.

    Since torch 2.11 cuDNN is the first choice on Hopper and Blackwell (SM 9.0, 10.x), and
    its masked attention fails in training: on an H200 (torch 2.11, cu130) Chroma's first
    backward stopped with `mha_graph.execute(...).is_good()`, an illegal memory access
    without CUDA_LAUNCH_BLOCKING. Upstream reports the same error (pytorch#122695), NaN
    query gradients with a mask (#196678) and masks of another dtype misread (#191612).
    Chroma, and Qwen-Image for batches of unequal captions, give their denoiser a mask."""
    import torch

    torch.backends.cuda.enable_cudnn_sdp(False)


GPU_MEMORY_CAP_ENV = "DT_GPU_MEMORY_CAP_GIB"


def cap_gpu_memory() -> float | None:
    """Hold this process's CUDA allocator to DT_GPU_MEMORY_CAP_GIB GiB when that is set, so
    a big card rehearses a small one (bench/gpu_memory.py runs the 24 and 16 GB presets so);
    an allocation past it fails as on that card. Returns the cap in GiB, or None (unset, or
    no CUDA GPU: the CPU has no allocator to hold)."""
    text = os.environ.get(GPU_MEMORY_CAP_ENV, "").strip()
    if not text:
        return None
    import torch

    if not torch.cuda.is_available():
        return None
    total = torch.cuda.get_device_properties(0).total_memory
    cap = float(text)
    torch.cuda.set_per_process_memory_fraction(min(1.0, cap * 2**30 / total))
    return cap


def memory_trace(label: str) -> None:
    """With DT_MEMORY_TRACE set, print the CUDA allocator's peak since the last trace and
    what it holds now, then start a new peak: where loading and caching spend the GPU,
    step by step (bench/gpu_memory.py's runs set it). Nothing without a CUDA GPU."""
    if not os.environ.get("DT_MEMORY_TRACE"):
        return
    import torch

    if not torch.cuda.is_available():
        return
    gib = 2**30
    print(f"memory trace {label}: peak {torch.cuda.max_memory_allocated() / gib:.2f} GiB, "
          f"now {torch.cuda.memory_allocated() / gib:.2f} GiB", flush=True)
    torch.cuda.reset_peak_memory_stats()


def is_out_of_memory(exc: BaseException) -> bool:
    """torch's CUDA out-of-memory error (torch.OutOfMemoryError)."""
    import torch

    return isinstance(exc, torch.OutOfMemoryError)


@contextlib.contextmanager
def plain_forward(model: Any) -> Iterator[None]:
    """Run `model` without the forward accelerate patched into it for mixed precision
    (autocast, outputs cast to fp32): a pipeline wants outputs in the model's own dtype,
    since its VAE decodes what the denoiser returns."""
    patched = model.__dict__.get("forward")
    original = model.__dict__.get("_original_forward")
    if patched is None or original is None:
        yield
        return
    model.forward = original
    try:
        yield
    finally:
        model.forward = patched


def unwrap(model: Any) -> Any:
    """The plain module under accelerate/DDP/torch.compile wrappers."""
    while True:
        inner = getattr(model, "module", None) or getattr(model, "_orig_mod", None)
        if inner is None:
            return model
        model = inner


# A VAE encode batch holds at most this many pixels (frames counted, up to the 4 a causal
# video VAE encodes at once): 4 images at 512 px, 1 at 1024 px. Its activations grow with
# the pixels, not the speed (a 1024 px image already fills a GPU): on an H200, Qwen-Image's
# VAE held 10.7 GiB encoding 4 images at 1024 px beside its 15.4 GiB text encoder, over a
# 24 GB card, where one at a time holds 2.7 (docs/memory.md).
VAE_BATCH_PIXELS = 4 * 512 * 512
VAE_MAX_BATCH = 4


def vae_batch_size(width: int, height: int, frames: int = 1,
                   limit: int = VAE_MAX_BATCH) -> int:
    """How many items of this shape the cache builder encodes at once (at least one); the
    memory estimate's caching phase counts the same batch."""
    pixels = width * height * max(1, min(frames, 4))
    return max(1, min(limit, VAE_BATCH_PIXELS // max(pixels, 1)))


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
        latents = _posterior(vae, pixels, generator)
    finally:
        if upcast:
            vae.to(torch.float16)
    shift = getattr(vae.config, "shift_factor", None)
    if shift is not None:
        latents = latents - shift
    return (latents * vae.config.scaling_factor).to(vae.dtype)


def _posterior(vae: Any, pixels: Any, generator: Any) -> Any:
    """The VAE posterior's mean, or a sample drawn with `generator`."""
    import torch

    with torch.no_grad():
        dist = vae.encode(pixels.to(vae.device, vae.dtype)).latent_dist
        latents = dist.mean
        if generator is not None:
            noise = standard_noise(latents.shape, generator, latents.device)
            latents = latents + dist.std * noise.to(latents.dtype)
    return latents


def encode_causal_latents(vae: Any, clips: Any, generator: Any = None) -> Any:
    """Normalised latents of a Wan-style causal 3D VAE (Wan's, Qwen-Image's) for clips
    [B, 3, F, H, W] in [-1, 1]: (z - latents_mean) / latents_std per channel, as their
    pipelines undo before decoding, [B, z, F', H/8, W/8]. The posterior mean without a
    generator, a sample with one."""
    import torch

    latents = _posterior(vae, clips, generator)
    shape = (1, vae.config.z_dim, 1, 1, 1)
    mean = torch.tensor(vae.config.latents_mean).view(shape).to(latents.device, latents.dtype)
    std = torch.tensor(vae.config.latents_std).view(shape).to(latents.device, latents.dtype)
    return ((latents - mean) * (1.0 / std)).to(vae.dtype)

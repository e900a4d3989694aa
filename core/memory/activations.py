"""Activation memory, estimated from a component's config and the run's shape.

Pure functions of config dicts (no torch). Each counts the tensors autograd keeps for the
backward pass (or, for the caching phase, the tensors alive at once during inference)
in *units*: one block's hidden state, batch x tokens x width elements, times the bytes of
the compute dtype. The per-block unit counts are the module-level coefficients below, so
they can be calibrated against measured runs without touching the formulas.

Calibrated on: fake-tensor measurements of the full-size architectures
(core/models/full_size: SD1.5, SDXL base, SD3.5 medium, FLUX.1-dev), torch 2.13 and
diffusers 0.42, by bench/activations.py: the denoiser built on the meta device with the
trainer's LoRA (rank 16, attention targets, fp32) on a frozen bf16 base, one forward under
CUDA autocast's casting rules, the fp32 MSE loss and the backward, as fake CPU tensors
under torch's MemTracker; the figure is the step's peak less parameters and gradients.
Cases: each family's preset (resolution, batch), and 512 and 1024 px at batch 1 and 4,
with and without gradient checkpointing (33 in all). The formulas give 1.00 to 1.20 times
the measurement (UNets 1.00-1.09, Flux 1.01-1.02, SD3 1.04-1.20, highest with
checkpointing at 512 px). Not measured, and not in these figures: the CUDA caching
allocator's rounding and fragmentation and cuBLAS/attention workspaces (the estimate's
separate CUDA-context part), nor kernels that save more on CUDA than their meta
implementations say. The tiny models are not covered: their constant-size tensors
(time and text embeddings) dominate, and the formulas give 0.7 to 1.35 times their
measurement, a few MB. Recalibrate with `python bench/activations.py` (or from the
trainer's `memory` events of measured GPU runs): change the numbers here only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

# ---------------------------------------------------------------- UNet (SD1.5, SD2, SDXL)

# ResnetBlock2D: norm, SiLU, conv, time-embedding add, norm, SiLU, conv, residual, output;
# under autocast the group norms' outputs (and what SiLU saves of them) are fp32, hence
# more than the nine tensors counted. This and the transformer block: measured.
UNET_RESNET_UNITS = 9.5
# BasicTransformerBlock: three norms, self-attention q/k/v/out, cross-attention q/out,
# GEGLU feed-forward (projection to 8x width, GELU and product at 4x), residuals.
UNET_TRANSFORMER_UNITS = 34.0
# Transformer2DModel around its blocks (group norm, proj_in, proj_out, residual); it is
# not checkpointed, so it counts with and without gradient checkpointing.
UNET_STACK_UNITS = 4.0
# Up-block resnets read the skip connection concatenated to their input: wider tensors.
UNET_UP_WIDTH = 1.5

# ---------------------------------------------------------------- MMDiT (SD3, Flux)

# A joint (double-stream) block over image + text tokens at the model width: modulated
# norms (fp32 under autocast), q/k/v with q/k norms and rotary copies, attention output
# and projection, gated residuals, MLP at 4x width (projection and GELU) and back.
MMDIT_BLOCK_UNITS = 24.0
# Flux's single-stream block: one fused projection to q/k/v and the 4x MLP, no separate
# text stream or second modulation.
MMDIT_SINGLE_BLOCK_UNITS = 18.5
# SD3.5's dual-attention blocks add a second self-attention over the image tokens only
# (in image units: batch x image tokens x width), inside the same checkpointed block.
MMDIT_DUAL_ATTENTION_UNITS = 8.0
# Embedders, final norm and projection, the packed latents and the loss, outside blocks.
MMDIT_OUTSIDE_UNITS = 5.0
# BACKWARD_BLOCKS for an MMDiT block: measured lower than a UNet's (about 1.1 of the
# largest block for Flux, about 0.9 for SD3.5; the higher one, so SD3.5 errs high).
MMDIT_BACKWARD_BLOCKS = 1.15

# ---------------------------------------------------------------- both kinds

# With gradient checkpointing each checkpointed block keeps only its input.
CHECKPOINT_INPUT_UNITS = 1.0
# During backward one block is recomputed and its activations' gradients live beside it:
# the largest block's full activations, this many times.
BACKWARD_BLOCKS = 1.5

# ---------------------------------------------------------------- caching phase (inference)

# VAE encoder: full-resolution tensors at its first width alive at once (input, norm,
# activation, convolution output), measured. Fake tensors (bench/activations.py's
# machinery) hold 5.0 for the SD1.5, SDXL and Flux VAEs at 512 and 1024 px. On an H200
# the cache build held 6.1 (SD1.5, 512 px, batch 4, fp32) and 6.1 (SDXL, 1024 px,
# batch 4, bf16) beside its encoders: CUDA's convolution workspaces come on top.
VAE_ENCODE_UNITS = 6.0
# The causal video VAEs (Wan's, Qwen-Image's) keep two frames of every convolution's input
# for the next chunk: torch's tracker counts 10.1 such tensors on the CPU where it counts
# 5.0 for AutoencoderKL, and on an H200 Qwen-Image's held 14.2 (10.66 GiB over its text
# encoder and VAE, 4 images at 1024 px in bf16; 2026-11-28, docs/memory.md).
VAE_ENCODE_UNITS_BY_CLASS = {"AutoencoderKLWan": 14.2, "AutoencoderKLQwenImage": 14.2}
# A validation round (sampling, then the VAE decode) over the frozen weights: on an H200
# it held 9.8 to 10.2 such full-resolution tensors at 1024 px (sdxl, sd3, flux2, chroma,
# z_image; bf16), 10.8 (Flux) and 8.4 (SD1.5) at 512 px, where the sampler's own share is
# larger; measured as the round's peak less the weights, the LoRA, its optimizer states
# and the VAE (docs/memory.md). In the compute dtype's bytes, whatever the VAE's.
VAE_DECODE_UNITS = 11.0
# Qwen-Image's causal VAE (and the 20B denoiser's sampling) held 22.2 at 1024 px on an H200
# (4.16 GiB over the weights, LoRA, optimizer states and VAE; 2026-11-28). Wan's VAE is the
# same architecture, but its video decode is not measured yet: it keeps the 2-D figure.
VAE_DECODE_UNITS_BY_CLASS = {"AutoencoderKLQwenImage": 22.2}
# Text encoder layer: feed-forward tensors at the intermediate width alive at once.
TEXT_FF_UNITS = 3.0
# Attention scores and their softmax, for encoders that run eager attention (T5's bias).
TEXT_SCORE_COPIES = 2.0


@dataclass(frozen=True)
class StepShape:
    """What one training step processes on one GPU."""

    latent_height: int
    latent_width: int
    batch: int
    dtype_bytes: int  # the compute dtype's: 2 under fp16/bf16 autocast, else 4
    checkpointing: bool
    # A video family's latent frames per sample (Geometry.latent_frames):
    # the image tokens of every block, and a VAE encode, multiply by them.
    latent_frames: int = 1
    # An edit family joins each control image's tokens to the target's (FLUX.1 Kontext,
    # Qwen-Image-Edit): the image tokens of every block multiply by 1 + controls.
    image_sequences: int = 1


def _per_level(value: Any, levels: int) -> list[int]:
    """A UNet setting given as one int or one per level."""
    if isinstance(value, (list, tuple)):
        return [int(v if not isinstance(v, (list, tuple)) else max(v)) for v in value]
    return [int(value)] * levels


def _unet_modules(config: dict[str, Any], shape: StepShape
                  ) -> tuple[list[tuple[float, float]], float]:
    """(full activations, input) of each checkpointable module in elements, and the
    elements kept outside them, walking the down, mid and up blocks level by level."""
    widths = list(config.get("block_out_channels", (320, 640, 1280, 1280)))
    n = len(widths)
    layers = _per_level(config.get("layers_per_block", 2), n)
    depth = _per_level(config.get("transformer_layers_per_block", 1), n)
    down = config.get("down_block_types", ())
    up = config.get("up_block_types", ())
    modules: list[tuple[float, float]] = []
    outside = 0.0

    def level(i: int, resnets: int, attention: bool, width_factor: float) -> None:
        nonlocal outside
        h = math.ceil(shape.latent_height / 2 ** i)
        w = math.ceil(shape.latent_width / 2 ** i)
        unit = shape.batch * h * w * widths[i]
        for _ in range(resnets):
            modules.append((UNET_RESNET_UNITS * width_factor * unit, width_factor * unit))
            if attention:
                modules.extend([(UNET_TRANSFORMER_UNITS * unit, unit)] * depth[i])
                outside += UNET_STACK_UNITS * unit

    for i in range(n):
        level(i, layers[i], i < len(down) and "CrossAttn" in down[i], 1.0)
    mid = config.get("mid_block_type", "UNetMidBlock2DCrossAttn")
    if mid is not None:  # resnet, attention, resnet at the lowest resolution
        level(n - 1, 1, "CrossAttn" in mid, 1.0)
        level(n - 1, 1, False, 1.0)
    for k in range(n):
        i = n - 1 - k
        level(i, layers[i] + 1, k < len(up) and "CrossAttn" in up[k], UNET_UP_WIDTH)
    return modules, outside


def _kept(modules: list[tuple[float, float]], outside: float, checkpointing: bool,
          backward_blocks: float = BACKWARD_BLOCKS) -> float:
    """Elements kept for backward: everything, or each module's input plus one module
    recomputed with its gradients."""
    if not checkpointing:
        return sum(full for full, _ in modules) + outside
    largest = max((full for full, _ in modules), default=0.0)
    return (CHECKPOINT_INPUT_UNITS * sum(inp for _, inp in modules) + outside
            + backward_blocks * largest)


def unet_activation_bytes(config: dict[str, Any], shape: StepShape) -> int:
    """Activations of one UNet2DConditionModel training step (diffusers checkpoints each
    resnet and each transformer block when gradient checkpointing is on)."""
    modules, outside = _unet_modules(config, shape)
    return int(_kept(modules, outside, shape.checkpointing) * shape.dtype_bytes)


def mmdit_activation_bytes(config: dict[str, Any], shape: StepShape, text_tokens: int,
                           patch: int) -> int:
    """Activations of one SD3/Flux transformer step: image tokens (latent / patch,
    squared) and text tokens run through every block at the model width. A joint block
    with SD3.5's second self-attention is one checkpointed module with it."""
    width = int(config.get("num_attention_heads", 24)) * int(config.get("attention_head_dim", 64))
    image = math.ceil(shape.latent_height / patch) * math.ceil(shape.latent_width / patch) \
        * shape.latent_frames * shape.image_sequences
    unit = shape.batch * (image + text_tokens) * width
    dual = set(config.get("dual_attention_layers") or ())
    extra = MMDIT_DUAL_ATTENTION_UNITS * shape.batch * image * width
    modules = [(MMDIT_BLOCK_UNITS * unit + (extra if i in dual else 0.0), unit)
               for i in range(int(config.get("num_layers", 0)))]
    modules += [(MMDIT_SINGLE_BLOCK_UNITS * unit, unit)] * int(config.get("num_single_layers", 0))
    kept = _kept(modules, MMDIT_OUTSIDE_UNITS * unit, shape.checkpointing,
                 MMDIT_BACKWARD_BLOCKS)
    return int(kept * shape.dtype_bytes)


def vae_encode_bytes(config: dict[str, Any], height: int, width: int, batch: int,
                     dtype_bytes: int) -> int:
    """Peak of a VAE encode of `batch` images at height x width pixels (no gradients)."""
    units = VAE_ENCODE_UNITS_BY_CLASS.get(config.get("_class_name", ""), VAE_ENCODE_UNITS)
    return int(units * batch * height * width * _vae_width(config) * dtype_bytes)


def _vae_width(config: dict[str, Any]) -> int:
    """The VAE's full-resolution width (AutoencoderKLQwenImage names it base_dim)."""
    return int(list(config.get("block_out_channels", (config.get("base_dim", 128),)))[0])


def validation_bytes(config: dict[str, Any], height: int, width: int, frames: int,
                     dtype_bytes: int) -> int:
    """What one validation image (or a video's decoded frames, `frames` at a time) holds
    beyond the weights: the sampling and the VAE decode at height x width pixels."""
    units = VAE_DECODE_UNITS_BY_CLASS.get(config.get("_class_name", ""), VAE_DECODE_UNITS)
    return int(units * frames * height * width * _vae_width(config) * dtype_bytes)


def text_encode_bytes(config: dict[str, Any], tokens: int, batch: int, dtype_bytes: int,
                      eager_scores: bool) -> int:
    """Peak of one text encoder's forward on `batch` prompts of `tokens` tokens."""
    hidden = int(config.get("hidden_size") or config.get("d_model") or 768)
    inner = int(config.get("intermediate_size") or config.get("d_ff") or 4 * hidden)
    heads = int(config.get("num_attention_heads") or config.get("num_heads") or 12)
    elements = TEXT_FF_UNITS * batch * tokens * inner + 2 * batch * tokens * hidden
    if eager_scores:
        elements += TEXT_SCORE_COPIES * batch * heads * tokens * tokens
    return int(elements * dtype_bytes)

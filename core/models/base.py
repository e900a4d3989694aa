"""The protocol every model family implements.

A family module (core/models/sd15.py, ...) exposes a module-level `FAMILY` object that
satisfies `ModelFamily`. Heavy imports (torch, diffusers, transformers) happen inside the
module, which the registry imports only when the family is used.

Tensor conventions:
- pixels: float [B, 3, H, W] in [-1, 1]; H and W are multiples of 64.
- latents: what the denoiser trains on, already scaled (and shifted) per family.
- text: `encode_prompts` returns one dict per prompt with unbatched tensors:
  "prompt_embeds" [L, D], "prompt_mask" [L] (bool, True for real tokens) and, where the
  family has them, "pooled_prompt_embeds" [P]. L may differ between prompts; collate pads
  to the batch's longest and `predict` receives the padded batch with its mask.
- extra conditioning per item (SDXL's size/crop ids): "original_size" (h, w),
  "crop_top_left" (top, left), "target_size" (h, w).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol


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
    extras: dict[str, Any] = field(default_factory=dict)


@dataclass
class NoiseSample:
    noisy: Any  # model input latents
    timesteps: Any  # what the denoiser is given
    target: Any  # what its output is compared with
    weights: Any | None = None  # per-item loss weights, or None for uniform


class ModelFamily(Protocol):
    name: str  # "sd15"
    prediction: str  # "epsilon" | "v_prediction" | "flow_matching"
    text_encoder_count: int

    def build_tiny(self, out_dir: Path, seed: int = 0) -> None:
        """Write a tiny random model of this family as a diffusers folder (offline)."""

    def load(self, path: str, *, dtype: Any = None, device: Any = "cpu") -> Components:
        """Load from a diffusers folder, a hub id or a single-file .safetensors."""

    def encode_prompts(self, c: Components, prompts: list[str]) -> list[dict[str, Any]]: ...

    def encode_images(self, c: Components, pixels: Any) -> Any: ...

    def noise_and_target(self, c: Components, latents: Any, generator: Any = None,
                         timesteps: Any = None, noise: Any = None) -> NoiseSample: ...

    def predict(self, c: Components, sample: NoiseSample, text: dict[str, Any],
                extra: dict[str, Any] | None = None) -> Any:
        """Run the denoiser on a collated batch (text holds padded embeds and mask)."""

    def loss(self, c: Components, prediction: Any, sample: NoiseSample,
             min_snr_gamma: float = 0.0) -> Any:
        """Mean loss over the batch, weighted as the family's scheme wants."""

    def lora_target_modules(self) -> list[str]: ...

    def save_lora(self, c: Components, out_dir: Path) -> dict[str, Path]:
        """Save the denoiser's LoRA: diffusers format (pytorch_lora_weights.safetensors,
        loads with load_lora_weights) and a ComfyUI/A1111 (kohya) format file."""

    def validation_pipeline(self, c: Components) -> Any: ...

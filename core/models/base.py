"""The protocol every model family implements.

A family folder (core/models/families/<name>/, found by the registry) exposes a `FAMILY`
object that satisfies `ModelFamily`; optional members default in `FamilyDefaults`, so
shared code reads them without asking which family it is. Heavy imports (torch,
diffusers, transformers) happen inside functions, so importing a family stays cheap.

Tensor conventions:
- pixels: float [B, 3, H, W] in [-1, 1]; H and W are multiples of 64.
- latents: what the denoiser trains on, already scaled (and shifted) per family.
- text: `encode_prompts` returns one dict per prompt with unbatched tensors:
  "prompt_embeds" [L, D], "prompt_mask" [L] (bool, True for real tokens) and, where the
  family has them, "pooled_prompt_embeds" [P]. L may differ between prompts; collate pads
  to the batch's longest. sd15-flux and Chroma encode at a fixed L, padded as their
  pipelines pad at inference (CLIP 77; SD3 77 + T5 256; Flux and Chroma T5 512). All but
  Chroma give their denoiser no mask, as the pipelines do: the mask only marks the real
  tokens. Chroma's mask is what its transformer attends to (the real tokens and one
  padding token, see chroma.py), and its `predict` passes it. Z-Image keeps each prompt's
  real tokens only (its own L) and hands the transformer the masked rows.
- extra conditioning per item (SDXL's size/crop ids): "original_size" (h, w),
  "crop_top_left" (top, left), "target_size" (h, w), in pixels; each a (h, w) pair for
  the whole batch or a [B, 2] tensor/list of pairs; or "time_ids" [B, 6] directly.
  Missing ones default to the batch's pixel size, (0, 0).
- `predict` takes the collated batch (core/data/collate.py) once and reads the text and
  the conditioning it needs from it.

Errors: `load` raises core.models.loading.ModelLoadError, whose `.problem` (a Problem)
names the path or hub id and what to do. `registry.get_family` raises ValueError for an
unknown name. Each family's tiny builder is its folder's tiny.py; core/models/tiny/:
`core.models.tiny.resolve_model_path("tiny:sd15", workspace)` turns `tiny:<family>` into
a built folder before `load`.

Loading: every module comes back on `device`, in eval mode, with requires_grad False;
the trainer enables what it trains (peft `add_adapter` does so for LoRA weights; a full
fine-tune calls `denoiser.requires_grad_(True)` and `.train()`). `dtype` applies to all
modules; an fp16 VAE whose config says force_upcast encodes in float32.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

from core.models.capabilities import (
    AudioSpec,
    EditSpec,
    ExpertSpec,
    FirstImageSpec,
    MemorySpec,
    RandomSpec,
    SingleFileSpec,
    ValidationSpec,
)
from core.models.components import Components, NoiseSample
from core.models.defaults import FamilyDefaults
from core.models.geometry import Geometry
from core.models.routing import RoutingSpec

__all__ = ["Components", "FamilyDefaults", "ModelFamily", "NoiseSample"]


class ModelFamily(Protocol):
    name: str  # its folder under core/models/families/, and model.family
    prediction: str  # "epsilon" | "v_prediction" | "flow_matching"
    text_encoder_count: int
    # Whether `loss` applies train.min_snr_gamma (the check warns where it is ignored).
    # StableDiffusionFamily says True, FlowFamily False: a family on either inherits it.
    uses_min_snr: bool
    # Optional members with defaults in FamilyDefaults (see there).
    geometry: Geometry
    video: bool
    # Capabilities (core/models/capabilities.py), None where the family has none; the
    # always-present ones (single_file, random, validation) have empty defaults.
    audio: AudioSpec | None
    edit: EditSpec | None
    first_image: FirstImageSpec | None
    memory: MemorySpec  # the memory estimate's; empty by default
    experts: ExpertSpec | None
    single_file: SingleFileSpec
    random: RandomSpec
    validation: ValidationSpec
    train_guidance: float | None
    max_sequence_length: int | None
    text_encoder_lora_targets: list[str] | None
    diffusers_lokr: bool
    pipeline_prefix: str
    trained_tiny: tuple[tuple[str, str], ...]
    block_lists: tuple[str, ...]
    routing: RoutingSpec | None

    def config_problems(self, cfg: Any) -> list[Any]:
        """This family's own checks of a Config at --stage check (Problems)."""

    def configure_run(self, c: Components, cfg: Any) -> None:
        """The run's family-read settings onto the loaded model (FamilyDefaults')."""


    def load(self, path: str, *, dtype: Any = None, device: Any = "cpu",
             config: str | None = None) -> Components:
        """Load from a diffusers folder, a hub id or a single-file .safetensors.

        dtype: None, a torch dtype, or "no"/"fp16"/"bf16". config (single files only):
        a diffusers folder or hub id with the matching configs.
        """

    def set_prediction_type(self, c: Components, prediction_type: str) -> None:
        """model.prediction_type: "auto" keeps what the loaded scheduler config says;
        "epsilon"/"v_prediction" make training and validation use that target instead
        (SD2-base single files, v-prediction fine-tunes). Flow families accept only
        "auto"."""

    def encode_prompts(self, c: Components, prompts: list[str]) -> list[dict[str, Any]]:
        """One dict per prompt (see the module docstring), batched internally."""

    def encode_images(self, c: Components, pixels: Any, generator: Any = None) -> Any:
        """Scaled latents of pixels [B, 3, H, W] in [-1, 1] (a video family's clips:
        [B, 3, F, H, W]): a posterior sample drawn with `generator`, or the posterior mean
        when generator is None (deterministic). A family that conditions on the pixels
        too (Wan image-to-video) may return a dict of batched tensors holding "latents":
        the cache keeps the others in the same entry and hands them to `predict` in the
        batch, as per-item lists under their keys."""

    def noise_and_target(self, c: Components, latents: Any, generator: Any = None,
                         timesteps: Any = None, noise: Any = None,
                         noise_offset: float = 0.0) -> NoiseSample:
        """Noise the latents at random timesteps (or the given ones, with the given noise,
        for reproducible evaluation). Random draws use `generator` (may be a CPU one).
        noise_offset (epsilon/v families; flow families refuse it at check) offsets
        drawn noise per image and channel."""

    def predict(self, c: Components, sample: NoiseSample, batch: dict[str, Any]) -> Any:
        """Run the denoiser on a collated batch: its padded text embeds (and mask, pooled
        embeds, size ids) condition `sample.noisy`."""

    def loss(self, c: Components, prediction: Any, sample: NoiseSample,
             min_snr_gamma: float = 0.0) -> Any:
        """Mean loss over the batch, weighted as the family's scheme wants."""

    def lora_target_modules(self, scope: str = "attention") -> list[str]:
        """Module names LoRA adapts: "attention" (diffusers' examples) or "all" (also the
        convolutions, feed-forwards and projections, LoCon style: more capacity)."""

    def save_lora(self, c: Components, out_dir: Path) -> dict[str, Path]:
        """Save the denoiser's LoRA: diffusers format (pytorch_lora_weights.safetensors,
        loads with load_lora_weights) and a ComfyUI/A1111 (kohya) format file."""

    def validation_pipeline(self, c: Components) -> Any: ...

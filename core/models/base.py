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

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from core.models.geometry import STILLS, Geometry
from core.models.routing import RoutingSpec


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
    # Per-family settings, set by `load`, read by that family only (a test may change them).
    max_sequence_length: int | None = None  # sd3/flux: T5 tokens the text is padded to
    has_t5: bool = False  # sd3: whether the T5 encoder was loaded (it may be left out)
    guidance: float | None = None  # flux: guidance value given to a distilled model
    pipeline_class: str | None = None  # flux2: Flux2KleinPipeline or Flux2Pipeline (dev)
    is_distilled: bool = False  # flux2: a step-distilled klein (model_index.json)
    flow: Any = None  # flow families: objectives.FlowTraining of the run (None: defaults)
    companion: Any = None  # ideogram4: the frozen unconditional transformer validation loads
    denoiser_stream: Any = None  # a meta-device denoiser filled where it runs (stream_load.py)


@dataclass
class NoiseSample:
    noisy: Any  # model input latents
    timesteps: Any  # what the denoiser is given
    target: Any  # what its output is compared with
    weights: Any | None = None  # per-item loss weights, or None for uniform
    mask: Any | None = None  # [B, 1, H, W] loss mask (datasets.N.masks), or None


class FamilyDefaults:
    """The defaults of the optional family members shared code reads (core/config,
    core/train, full_size, memory, loading): StableDiffusionFamily and FlowFamily inherit
    them, and a family sets only those that differ. Shared code reads these members and
    never a family's name, so a new family folder needs no change outside it."""

    name: str = ""
    # What the VAE and denoiser do to a sample's shape (core/models/geometry.py): stills
    # by default; a video family (Wan) declares its frame rule and compression.
    geometry: Geometry = STILLS

    @property
    def video(self) -> bool:
        """A video family: its datasets may hold clips (datasets.N.frames), its latents
        keep a frame axis, and validation samples validation.frames frames."""
        return self.geometry.video
    # flux/flux2: guidance value a guidance-distilled model gets in training (None: the
    # family has no guidance-distilled models, and train.guidance is refused at check).
    train_guidance: float | None = None
    # Text tokens the prompt is padded to (T5/Qwen); None where the tokenizer decides.
    max_sequence_length: int | None = None
    # Validation hands the pipeline a list of per-prompt embeds (Z-Image), not a tensor.
    list_prompt_embeds: bool = False
    # The pipeline keyword validation passes the text mask as (Chroma), or None.
    pipeline_mask_kwarg: str | None = None
    # Text-encoder modules train.text_encoder_lora adapts; None: not supported.
    text_encoder_lora_targets: list[str] | None = None
    # Whether diffusers' load_lora_weights of this pipeline loads LoKr (core/models/adapters.py).
    diffusers_lokr: bool = False
    # Memory estimate (core/memory_estimate.py): text tokens attended beside the padded
    # max_sequence_length (SD3's CLIP tokens), and the latent patch the family packs
    # itself before the transformer (Flux-style 2x2 packing: 2; its configs say 1).
    extra_text_tokens: int = 0
    latent_packing: int = 1
    # A transformer config the MMDiT activation formula cannot read as is: a staticmethod
    # config -> (MMDiT-shaped config, patch size) (Z-Image), or None.
    activation_layout: Any = None
    # random:<family> (core/models/full_size/build.py): the scheduler class training
    # uses (None: the one model_index.json names) and the CLIP tokenizers that pad with
    # "!" as OpenCLIP's do in the real model (the others pad with end-of-text).
    train_scheduler: str | None = None
    bang_padded_tokenizers: tuple[str, ...] = ()

    # Original-format single files (core/models/loading.py): key fragments that mark this
    # family's checkpoints, and the order families are tried in (lower first: the most
    # specific, whose keys include another family's). model_index.json `_class_name`
    # prefix of its diffusers pipelines ("" : none).
    single_file_markers: tuple[str, ...] = ()
    single_file_rank: int = 100
    # The family whose single files have this layout too (Kontext's are FLUX.1's).
    single_file_layout_of: str = ""
    pipeline_prefix: str = ""

    # Trained tiny models (`tiny:<name>`): (name, module whose build() loads its weights).
    trained_tiny: tuple[tuple[str, str], ...] = ()
    # A distilled checkpoint's (steps, guidance) for validation.model; None: none known.
    distilled_validation: tuple[int, float] | None = None

    # An edit family (FLUX.1 Kontext, Qwen-Image-Edit): how many control (reference)
    # images a sample may take (datasets.N.control, control_2, ...; 0: none, the
    # control keys are refused), and whether its text encoder reads them with the prompt
    # (Qwen-Image-Edit's Qwen2.5-VL), so text entries are keyed by caption and control
    # images and encoded by `encode_prompts_with_images`.
    control_images: int = 0
    text_reads_controls: bool = False

    # Why validation draws without a negative prompt (validation.negative_prompt, --n), as
    # the check's warning ends it ("FLUX.1 is guidance-distilled..."); "": it uses it.
    negative_prompt_note: str = ""
    # The setting that makes a model of this family image-to-video, where one checkpoint
    # does both and the folder cannot say (ltx2's 'model.ltx2_mode = "image_to_video"'):
    # the check's warning on an ignored validation.control_images names it.
    first_image_switch: str = ""

    # The merged model as one original-layout (A1111/ComfyUI) checkpoint file
    # (core/models/ldm_checkpoint.py, merged.safetensors): each text encoder's (component
    # folder, key prefix, "clip" | "open_clip"); empty: no such layout (a transformer
    # family's ComfyUI files split the model), and merge writes merged/ alone.
    checkpoint_text_encoders: tuple[tuple[str, str, str], ...] = ()

    # The denoiser's repeated blocks, its nn.ModuleLists' names in forward order (Flux: double,
    # then single): what model.blocks_to_swap streams from host memory (block_swap.py) and the
    # estimate sizes; none: a UNet (the check refuses it). `routing`: see core/models/routing.py.
    block_lists: tuple[str, ...] = ()
    routing: RoutingSpec | None = None

    def denoiser_stacks(self, denoiser: Any) -> list[list[Any]]:
        """The loaded denoiser's block stacks, one list of blocks (forward order) per
        transformer: `block_lists` of the unwrapped denoiser; a two-expert model one per
        expert. Empty when the family declares none."""
        from core.models.modules import unwrap

        model = unwrap(denoiser)
        stack = [block for name in self.block_lists for block in getattr(model, name)]
        return [stack] if stack else []

    def parked_modules(self, denoiser: Any) -> list[Any]:
        """Modules of the denoiser that can wait in host memory while another runs
        (model.offload_inactive_expert: Wan 2.2's low-noise expert); none by default."""
        return []

    def start_parking(self, denoiser: Any, device: Any, held_elsewhere: set[int]) -> None:
        """Put the parked modules' turn-taking in place (block_swap.ModuleParking), once
        the adapter is on; `held_elsewhere`: tensors the block swappers keep."""

    def single_file_problems(self, config: str, prediction_type: str) -> list[Any]:
        """--stage check of a usable single-file model.path of this family: warnings
        about what diffusers' default configs for it mean (Problems)."""
        return []

    def random_qwen_tokenizer(self, folder: Path) -> Any:
        """random:<family>: the tiny Qwen tokenizer (and template) of a family whose real
        model has a Qwen2 tokenizer, written to `folder` and loaded."""
        raise NotImplementedError(f"{self.name}: no tiny Qwen tokenizer for random:")

    def random_settings(self, c: Components) -> None:
        """random:<family>: the per-family Components settings `load` would set (a random
        model is built without a pipeline)."""

    def config_problems(self, cfg: Any) -> list[Any]:
        """This family's own checks of a Config at --stage check (Problems)."""
        return []

    def encode_controls(self, c: Components, controls: list[Any]) -> dict[str, Any]:
        """An edit family's cached control latents: `controls` holds one [B, 3, H, W]
        pixel batch in [-1, 1] per control image (control, control_2, ...), each resized
        and cropped to its target's bucket. By default {"control_latents": [B, K, C, h, w]},
        each control encoded as `encode_images` encodes a target (posterior mean); the
        dataset hands them to `predict` as per-item [K, C, h, w] tensors."""
        import torch

        encode = self.encode_images  # type: ignore[attr-defined]
        return {"control_latents": torch.stack([encode(c, x) for x in controls], dim=1)}

    def encode_prompts_with_images(self, c: Components, prompts: list[str],
                                   images: list[list[Any]]) -> list[dict[str, Any]]:
        """`encode_prompts` for a family whose text encoder reads the control images
        (`text_reads_controls`): `images[i]` holds prompt i's control images as PIL RGB
        images at their own size (orientation applied)."""
        raise NotImplementedError(f"{self.name}: its text encoder reads no images")

    def extra_stream_bytes(self, config: dict[str, Any], shape: Any) -> int:
        """The memory estimate's activations of a second token stream the denoiser runs
        beside the image tokens (LTX-2's audio), for the transformer `config` and the
        step `shape` (memory_activations.StepShape); 0 for a family with none."""
        return 0

    def takes_first_image(self, model: Any) -> bool:
        """Image-to-video: whether the config's model section `model` (paths resolved)
        samples from a first image, so validation.control_images gives each validation
        prompt its first frame (one image per prompt, passed as `validation_image_kwargs`
        gives it). The model decides (one family may load both kinds: wan's folders
        name their pipeline), or a family's own key where one checkpoint does both
        (ltx2: `first_image_switch`)."""
        return False

    def validation_image_kwargs(self, images: list[Any], resolution: int) -> dict[str, Any]:
        """The pipeline keyword arguments of one validation prompt's control images
        (validation.control_images; PIL RGB) for a validation at `resolution` (the side
        of its square): `image`, one image or a list of them."""
        return {"image": images[0] if len(images) == 1 else images}

    def audio_sample_rate(self, c: Components) -> int:
        """A family with audio (geometry.audio): the rate its audio encoder takes, which
        the cache reads a clip's track at."""
        raise NotImplementedError(f"{self.name}: trains no audio")

    def encode_audio(self, c: Components, waveform: Any, frames: int, fps: float,
                     generator: Any = None) -> Any:
        """A family with audio: latents [B, L, D] of `waveform` [B, channels, samples] at
        `audio_sample_rate`, the track under `frames` frames sampled at `fps`; cached in
        the clip's entry as "audio_latents" and handed to `predict` as a per-item list
        (None for a sample without audio)."""
        raise NotImplementedError(f"{self.name}: trains no audio")

    def configure_run(self, c: Components, cfg: Any) -> None:
        """The run's settings a family reads from the Config onto its loaded model, before
        the trainer adds what it trains (Wan 2.2: model.experts, which expert trains):
        `load` gets no Config. Raises ValueError, naming the key, for a setting the loaded
        model cannot take."""

    def trained_denoisers(self, cfg: Any, loaded: int) -> int:
        """How many of the `loaded` denoisers (Wan 2.2: two experts) the run trains, for
        the memory estimate: all by default."""
        return loaded


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
    train_guidance: float | None
    max_sequence_length: int | None
    list_prompt_embeds: bool
    pipeline_mask_kwarg: str | None
    text_encoder_lora_targets: list[str] | None
    diffusers_lokr: bool
    extra_text_tokens: int
    latent_packing: int
    activation_layout: Any
    train_scheduler: str | None
    bang_padded_tokenizers: tuple[str, ...]
    single_file_markers: tuple[str, ...]
    single_file_rank: int
    single_file_layout_of: str
    pipeline_prefix: str
    trained_tiny: tuple[tuple[str, str], ...]
    distilled_validation: tuple[int, float] | None
    control_images: int
    text_reads_controls: bool
    negative_prompt_note: str
    first_image_switch: str
    checkpoint_text_encoders: tuple[tuple[str, str, str], ...]
    block_lists: tuple[str, ...]
    routing: RoutingSpec | None

    def denoiser_stacks(self, denoiser: Any) -> list[list[Any]]:
        """The denoiser's swappable block stacks (FamilyDefaults')."""

    def parked_modules(self, denoiser: Any) -> list[Any]:
        """Modules that wait on the host while another runs (FamilyDefaults')."""

    def start_parking(self, denoiser: Any, device: Any, held_elsewhere: set[int]) -> None:
        """The parked modules' turn-taking (FamilyDefaults')."""

    def single_file_problems(self, config: str, prediction_type: str) -> list[Any]: ...

    def random_qwen_tokenizer(self, folder: Path) -> Any: ...

    def random_settings(self, c: Components) -> None: ...

    def config_problems(self, cfg: Any) -> list[Any]:
        """This family's own checks of a Config at --stage check (Problems)."""

    def audio_sample_rate(self, c: Components) -> int:
        """The rate a family with audio encodes at (FamilyDefaults')."""

    def encode_audio(self, c: Components, waveform: Any, frames: int, fps: float,
                     generator: Any = None) -> Any:
        """A clip's audio latents, for a family with audio (FamilyDefaults')."""

    def configure_run(self, c: Components, cfg: Any) -> None:
        """The run's family-read settings onto the loaded model (FamilyDefaults')."""

    def trained_denoisers(self, cfg: Any, loaded: int) -> int:
        """How many loaded denoisers the run trains (FamilyDefaults')."""

    def encode_controls(self, c: Components, controls: list[Any]) -> dict[str, Any]:
        """An edit family's cached control latents (FamilyDefaults')."""

    def encode_prompts_with_images(self, c: Components, prompts: list[str],
                                   images: list[list[Any]]) -> list[dict[str, Any]]:
        """Prompts read with their control images (FamilyDefaults')."""

    def extra_stream_bytes(self, config: dict[str, Any], shape: Any) -> int:
        """A second token stream's activations for the estimate (FamilyDefaults')."""

    def takes_first_image(self, model: Any) -> bool:
        """Whether the model samples from a first image (FamilyDefaults')."""

    def validation_image_kwargs(self, images: list[Any], resolution: int) -> dict[str, Any]:
        """A validation prompt's control images as pipeline kwargs (FamilyDefaults')."""

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

"""What SD3 and Flux share: flow matching (rectified flow) training, pipeline loading,
latents, the text-length check and LoRA files. The maths is in objectives.py.

Timesteps: the denoiser is given `timesteps = sigma * 1000`, the scale of
FlowMatchEulerDiscreteScheduler.timesteps (Flux's predict divides by 1000 again, as
FluxPipeline does).

Sigma sampling (`FlowFamily.timestep_sampling`, see objectives.sample_sigmas):
"logit_normal" (default, the SD3 paper's), "uniform", "mode" or "sigmoid". A run's
train.timestep_sampling, logit_mean, logit_std, mode_scale, flow_shift and loss_weighting
reach the family as `Components.flow` (objectives.FlowTraining); what they leave at "auto"
or 0 is the family's own default, `flow_settings` resolves both. Then the static shift
(train.flow_shift, or the family's):
SD3 uses its scheduler's `shift` (3.0 for SD3 medium), like diffusers' SD3 script, which
indexes the shifted scheduler sigmas; Flux's scheduler uses dynamic (resolution-dependent)
shifting at inference, and diffusers' Flux script trains unshifted, so Flux uses shift 1.

Loss weighting (`FlowFamily.loss_weighting`, see objectives.loss_weights): "none"
(default), "sigma_sqrt" or "cosmap". min_snr_gamma does not apply to flow matching and is
ignored (SNR weighting is a DDPM notion; these schemes are its flow counterparts).

Text: both families encode prompts through their pipeline's own `encode_prompt`, at a
fixed length (CLIP 77, T5 `max_sequence_length`) padded exactly as the pipelines pad, so
every prompt has the same L and collate never pads; the transformers take no text mask
(SD3Transformer2DModel and FluxTransformer2DModel have no argument for one, and the
pipelines attend to the padding too), so `prompt_mask` only marks the real tokens.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from core.models import comfy_file, loading
from core.models.adapters import adapter_kind, diffusers_kinds
from core.models.base import Components, FamilyDefaults, NoiseSample
from core.models.geometry import Geometry
from core.models.lora_files import (
    adapter_weights,
    base_weights,
    save_comfy_lora,
    save_diffusers_lora,
)
from core.models.modules import encode_latents, freeze
from core.models.objectives import (
    MODE_SCALE,
    SIGMA_EPS,
    FlowTraining,
    flow_noise_and_target,
    loss_weights,
    sample_sigmas,
    standard_noise,
    weighted_mse,
)


def pack_2x2(noisy: Any, family: str, vae: Any) -> tuple[Any, Any, Callable[[Any], Any]]:
    """Flux-style latent packing (Flux, Chroma; their pipelines share these helpers):
    latents [B, C, h, w] as 2x2-patch tokens [B, h*w/4, 4C], their img_ids, and the
    function that unpacks the transformer's output back to [B, C, h, w]. The memory
    estimate counts the same packing (`memory.latent_packing` = 2)."""
    from diffusers import FluxPipeline

    b, ch, h, w = noisy.shape
    if h % 2 or w % 2:
        raise ValueError(f"{family} latents must have even height and width, got {h}x{w}: "
                         "use image sides that are multiples of 16 pixels")
    packed = FluxPipeline._pack_latents(noisy, b, ch, h, w)
    img_ids = FluxPipeline._prepare_latent_image_ids(b, h // 2, w // 2, noisy.device,
                                                     noisy.dtype)
    scale = 2 ** (len(vae.config.block_out_channels) - 1)

    def unpack(out: Any) -> Any:
        return FluxPipeline._unpack_latents(out, h * scale, w * scale, scale)

    return packed, img_ids, unpack


class FlowFamily(FamilyDefaults):
    """What SD3 and Flux share; subclasses set the class attributes and the text/predict
    parts. Training knobs are attributes so a trainer may override them per instance."""

    name = "flow"
    # A 16-channel 8x VAE under a transformer that packs 2x2 latents (SD3, Flux, ...).
    geometry = Geometry(latent_channels=16)
    prediction = "flow_matching"
    text_encoder_count = 2
    uses_min_snr = False  # min-SNR is not defined for flow matching: loss ignores it
    pipeline_class_name = ""
    # A single-file model.path that holds only the diffusion model (ComfyUI's diffusion-
    # model files, in bf16, fp8 or fp8_scaled; `reads_transformer_file`): the transformer
    # class that reads it, and the hub repo whose other components and configs go with it
    # when model.config is empty ("" : load the file as a whole pipeline,
    # loading.load_single_file).
    transformer_class_name = ""
    single_file_default_config = ""
    # A checkpoint that bundles text encoders and a VAE beside the diffusion model, in
    # bf16, loads as a whole pipeline (loading.load_single_file; SD3's, FLUX.1's); False:
    # its diffusion model is read and the rest comes from model.config.
    whole_checkpoints = False
    transformer_lora_kwarg = "transformer_lora_layers"
    max_sequence_length = 256  # T5 tokens, the pipeline's own default
    timestep_sampling = "logit_normal"
    logit_mean = 0.0
    logit_std = 1.0
    mode_scale = MODE_SCALE
    loss_weighting = "none"

    # ------------------------------------------------------------ loading

    def _pipeline_class(self) -> Any:
        import diffusers

        return getattr(diffusers, self.pipeline_class_name)

    def load(self, path: str, *, dtype: Any = None, device: Any = "cpu",
             config: str | None = None, denoiser: Any = None) -> Components:
        """Load from a diffusers folder, a hub id or a single-file .safetensors.

        `config` (single files only): a diffusers folder or hub id holding the configs
        and any component the file lacks (Flux files usually hold only the transformer).
        `denoiser` (a folder only): its transformer already built, on the meta device by
        the streamed load (core/models/stream_files.py), taken in place of reading it.
        Errors are `loading.ModelLoadError` whose message names the path.
        """
        dtype = loading.resolve_dtype(dtype)
        kind = loading.checked_source(path, self.name)
        if kind == "file" and self.reads_transformer_file(path):
            pipe = self.load_transformer_file(path, dtype, config or "")
        elif kind == "file":
            pipe = loading.load_single_file(self._pipeline_class(), path, self.name, dtype,
                                            config)
        elif denoiser is not None:
            pipe = self._from_pretrained(path, kind, dtype, transformer=denoiser)
        else:
            pipe = self._from_pretrained(path, kind, dtype)
        c = self._components_from_pipeline(pipe, path, loading.fingerprint(path, kind))
        # A streamed denoiser has no storage to move yet (it is frozen, in eval mode).
        freeze((c.vae, *([] if denoiser is not None else [c.denoiser]), *c.text_encoders),
               device)
        return c

    def reads_transformer_file(self, path: str) -> bool:
        """Whether single file `path` loads as its transformer alone, the rest from
        model.config: the family names its transformer class, and the file holds fp8
        weights (read de-scaled, comfy_file.py), holds nothing but the diffusion model, or
        the family reads only the diffusion model of any checkpoint (`whole_checkpoints`)."""
        if not self.transformer_class_name:
            return False
        header = loading.safetensors_header(path)
        return (not self.whole_checkpoints or bool(comfy_file.layout(header))
                or not comfy_file.bundles_components(list(header)))

    def load_transformer_file(self, path: str, dtype: Any, config: str) -> Any:
        """The pipeline of a single file's transformer: the file's diffusion model
        (comfy_file.read_transformer: fp8 de-scaled) through diffusers'
        `<transformer_class_name>.from_single_file`, everything else from `config`
        (model.config: a diffusers folder or hub id), or from the repo diffusers guesses
        from the file's tensors, or `single_file_default_config`."""
        import diffusers

        problem = loading.single_file_config_problem(path, config, self.name)
        if problem is not None:
            raise loading.ModelLoadError(problem.where, problem.message)
        config = config or loading.default_config_repo(path) or self.single_file_default_config
        model_cls = getattr(diffusers, self.transformer_class_name)
        state = comfy_file.read_transformer(path, dtype)
        mapped = self.transformer_names(state)
        transformer = (loading.load_single_file_transformer(
            model_cls, path, config, self.name, dtype, state) if mapped is None else
            loading.load_mapped_transformer(model_cls, mapped, path, config, self.name, dtype))
        kind = loading.classify_source(config)
        kwargs = {**self._pretrained_components(config, kind), "transformer": transformer}
        if dtype is not None:
            kwargs["dtype"] = dtype
        return loading.from_pretrained(self._pretrained_class(config, kind), config, kind,
                                       f"the {self.name} text encoder, VAE and tokenizer",
                                       "model.config", **kwargs)

    def transformer_names(self, state: dict[str, Any]) -> dict[str, Any] | None:
        """A single file's transformer tensors under the diffusers model's names, for a
        family whose original layout diffusers has no converter for (its own mapping);
        None: `<transformer_class_name>.from_single_file` converts them."""
        return None

    def set_prediction_type(self, c: Components, prediction_type: str) -> None:
        """Flow matching has one target; only "auto" is accepted (the config check says
        so first, naming model.prediction_type)."""
        if prediction_type != "auto":
            raise loading.ModelLoadError("model.prediction_type", f"{prediction_type!r} does "
                                         f"not apply to {self.name}, which trains by flow "
                                         "matching; set it to \"auto\"")

    def _pretrained_class(self, path: str, kind: loading.SourceKind) -> Any:
        """The pipeline class a diffusers folder or hub id loads with: the family's own
        (Wan reads the folder's; Qwen-Image-Edit lets DiffusionPipeline pick)."""
        return self._pipeline_class()

    def _pretrained_components(self, path: str, kind: loading.SourceKind) -> dict[str, Any]:
        """Components handed to from_pretrained beside what the folder holds (SD3: None
        for a T5 the folder leaves out; Qwen-Image-Edit: its processor)."""
        return {}

    def _from_pretrained(self, path: str, kind: loading.SourceKind, dtype: Any,
                         **given: Any) -> Any:
        """The pipeline from `path`; `given`: components built already (a streamed
        transformer)."""
        try:
            kwargs = {**self._pretrained_components(path, kind), **given}
            if dtype is not None:
                kwargs["dtype"] = dtype
            return self._pretrained_class(path, kind).from_pretrained(
                path, local_files_only=(kind == "folder"), **kwargs)
        except Exception as exc:  # noqa: BLE001 - every loader failure becomes one message
            if kind == "hub":
                raise loading.hub_error(path, f"the {self.name} model", exc) from exc
            raise loading.ModelLoadError(path, f"cannot load this {self.name} diffusers "
                                         f"folder: {type(exc).__name__}: {str(exc)[:300]}"
                                         ) from exc

    def _components_from_pipeline(self, pipe: Any, source: str, fp: str) -> Components:
        """A pipeline with one text encoder (Chroma, Z-Image, Qwen-Image); SD3, Flux and
        FLUX.2 override it."""
        return Components(
            family=self.name, source=source, fingerprint=fp, vae=pipe.vae,
            denoiser=pipe.transformer, text_encoders=[pipe.text_encoder],
            tokenizers=[pipe.tokenizer], noise_scheduler=pipe.scheduler)

    def sequence_length(self, c: Components) -> int:
        """The text length (tokens) this model's prompts are encoded and padded at: the
        family's `max_sequence_length`, its pipeline's own default."""
        return self.max_sequence_length

    # ------------------------------------------------------------ images

    def encode_images(self, c: Components, pixels: Any, generator: Any = None) -> Any:
        """(latents - shift_factor) * scaling_factor of pixels in [-1, 1], [B, 16, H/8, W/8].

        Without a generator: the posterior mean (deterministic caches); with one: a
        posterior sample, what diffusers' training scripts do.
        """
        return encode_latents(c.vae, pixels, generator)

    # ------------------------------------------------------------ training

    def train_shift(self, c: Components) -> float:
        """The static sigma shift used in training (see the module docstring)."""
        cfg = c.noise_scheduler.config
        return 1.0 if cfg.get("use_dynamic_shifting", False) else float(cfg.get("shift", 1.0))

    def noise_and_target(self, c: Components, latents: Any, generator: Any = None,
                         timesteps: Any = None, noise: Any = None,
                         noise_offset: float = 0.0) -> NoiseSample:
        """Flow-matching sample. `timesteps` (optional, scheduler scale 0..1000, a scalar
        or [B]) fixes sigma = timesteps / 1000 and `noise` fixes the noise, for a
        deterministic evaluation; otherwise both are drawn with `generator`. Noise offset
        is an epsilon/v-family remedy (the config check refuses it here)."""
        import torch

        if noise_offset:
            raise ValueError(f"{self.name} trains by flow matching: noise_offset does not apply")

        b = latents.shape[0]
        n_train = int(c.noise_scheduler.config.get("num_train_timesteps", 1000))
        if noise is None:
            noise = standard_noise(latents.shape, generator, latents.device)
        if timesteps is None:
            sigmas = self.draw_sigmas(c, b, generator, latents.device)
        else:
            t = torch.as_tensor(timesteps, dtype=torch.float32).reshape(-1).to(latents.device)
            sigmas = (t / n_train).expand(b) if t.numel() == 1 else t / n_train
            sigmas = sigmas.clamp(SIGMA_EPS, 1.0 - SIGMA_EPS)
        noisy, target = flow_noise_and_target(latents, sigmas, noise)
        return NoiseSample(noisy=noisy, timesteps=sigmas * n_train, target=target,
                           weights=loss_weights(sigmas, self.flow_settings(c).loss_weighting))

    def flow_settings(self, c: Components) -> FlowTraining:
        """The run's choices (`c.flow`) with every unset one the family's own: its
        class attributes and `train_shift`. Every field is set in the result."""
        run = c.flow if c.flow is not None else FlowTraining()

        def pick(value: Any, default: Any) -> Any:
            return default if value is None else value

        return FlowTraining(
            timestep_sampling=run.timestep_sampling or self.timestep_sampling,
            logit_mean=pick(run.logit_mean, self.logit_mean),
            logit_std=pick(run.logit_std, self.logit_std),
            mode_scale=pick(run.mode_scale, self.mode_scale),
            shift=run.shift or self.train_shift(c),
            loss_weighting=run.loss_weighting or self.loss_weighting)

    def draw_sigmas(self, c: Components, n: int, generator: Any, device: Any) -> Any:
        """n training sigmas: the run's or family's sampling with the static shift (a
        family whose training script samples otherwise overrides this)."""
        s = self.flow_settings(c)
        return sample_sigmas(n, generator, device, s.timestep_sampling, s.logit_mean,
                             s.logit_std, s.shift, s.mode_scale)

    def check_text_length(self, batch: dict[str, Any], expected: int) -> None:
        """Embeddings always have the fixed length; another means a stale text cache."""
        got = batch["prompt_embeds"].shape[1]
        if got != expected:
            raise ValueError(f"{self.name} prompt embeddings have {got} tokens, expected "
                             f"{expected}: the text cache was built with another "
                             "max_sequence_length or model; delete the text cache to rebuild")

    def loss(self, c: Components, prediction: Any, sample: NoiseSample,
             min_snr_gamma: float = 0.0) -> Any:
        """Per-item MSE against noise - latents, weighted by sample.weights, batch mean.
        min_snr_gamma is ignored: it is not defined for flow matching."""
        return weighted_mse(prediction, sample.target, sample.weights, sample.mask)

    # ------------------------------------------------------------ LoRA

    def save_lora(self, c: Components, out_dir: Path) -> dict[str, Path]:
        """pytorch_lora_weights.safetensors (diffusers; PEFT key names and the adapter
        config as metadata, as diffusers' dreambooth scripts write; only for the kinds the
        family's pipeline loads, adapters.diffusers_kinds) and lora_comfyui.safetensors
        (`_save_comfy`)."""
        out_dir = Path(out_dir)
        peft_sd, config = adapter_weights(c.denoiser)
        files: dict[str, Path] = {}
        if adapter_kind(config) in diffusers_kinds(self.name):
            save_fn = self._pipeline_class().save_lora_weights
            files["diffusers"] = save_diffusers_lora(save_fn, self.transformer_lora_kwarg,
                                                     peft_sd, config, out_dir)
        else:
            out_dir.mkdir(parents=True, exist_ok=True)
        comfy = self._save_comfy(c, peft_sd, config, out_dir / "lora_comfyui.safetensors")
        if comfy is not None:
            files["comfyui"] = comfy
        return files

    def _save_comfy(self, c: Components, peft_sd: dict[str, Any], config: Any,
                    path: Path) -> Path | None:
        """The ComfyUI file: diffusers-style names with ComfyUI's suffixes per kind and one
        `.alpha` per module (lora_files.save_comfy_lora)."""
        return save_comfy_lora(peft_sd, config, path, base_weights(c.denoiser))

    # ------------------------------------------------------------ validation

    def validation_scheduler(self, c: Components) -> Any:
        from diffusers import FlowMatchEulerDiscreteScheduler

        return FlowMatchEulerDiscreteScheduler.from_config(c.noise_scheduler.config)

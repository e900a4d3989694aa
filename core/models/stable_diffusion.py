"""What the Stable Diffusion UNet families share (`StableDiffusionFamily`: each one's
family.py subclasses it and overrides the parts that differ): the SD UNet with CLIP text
encoders, DDPM epsilon or v-prediction training, diffusers folders and single files, and
the diffusers and kohya LoRA files.

Text: prompts are tokenized to the tokenizer's full padded length (77) and the encoder
runs without a padding mask, exactly as `StableDiffusionPipeline` does at inference, so
training sees the padding-token embeddings the model was trained with. `prompt_mask`
marks the real tokens (BOS..EOS) for whoever needs it; the UNet is not given it.

Latents: `encode_images` samples the VAE posterior with the given generator (what
diffusers' training scripts do); without a generator it takes the mean, which keeps
caches deterministic. Both are multiplied by the VAE's scaling_factor (after subtracting
its shift_factor where one is set).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from core.models import loading
from core.models.adapters import DIFFUSERS_KINDS, adapter_kind
from core.models.base import Components, FamilyDefaults, NoiseSample
from core.models.capabilities import RandomSpec
from core.models.geometry import Geometry
from core.models.lora_files import (
    adapter_weights,
    base_weights,
    has_adapter,
    kohya_tensors,
    save_diffusers_lora,
    write_kohya,
)
from core.models.modules import encode_latents, freeze, unwrap
from core.models.objectives import ddpm_noise_and_target, min_snr_weights, weighted_mse

LORA_TARGETS = ["to_k", "to_q", "to_v", "to_out.0"]
# The CLIP text encoders' attention, as diffusers' train_dreambooth_lora examples target.
TEXT_ENCODER_LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "out_proj"]
# save_lora_weights' arguments and the kohya prefixes, per text encoder.
TEXT_ENCODER_NAMES = ["text_encoder", "text_encoder_2"]
# LoCon-style extras: the resnets' convolutions, time projections, transformer in/out
# projections and feed-forwards (not conv_in/conv_out).
LORA_TARGETS_EXTRA = ["conv1", "conv2", "conv_shortcut", "time_emb_proj", "proj_in", "proj_out",
                      "ff.net.0.proj", "ff.net.2"]


class StableDiffusionFamily(FamilyDefaults):
    """The SD UNet families' code; each family's subclass sets its name, its single-file
    markers and what differs."""

    # The UNet halves its latent three times: pixel sides a multiple of 8 x 8.
    geometry = Geometry(spatial_multiple=64)
    # The real models' text width (the UNet's cross_attention_dim), where it tells this
    # family's folders from another of these families' (`_check_loaded`); 0: not checked.
    text_width = 0
    pipeline_prefix = "StableDiffusion"
    prediction = "epsilon"
    text_encoder_count = 1
    uses_min_snr = True  # min-SNR weights the epsilon and v losses (loss below)
    pipeline_class_name = "StableDiffusionPipeline"
    text_encoder_lora_targets = TEXT_ENCODER_LORA_TARGETS  # train.text_encoder_lora
    # Training's scheduler, built from the folder's scheduler config whatever inference
    # scheduler the index names (random:<family> builds it alike).
    random = RandomSpec(scheduler="DDPMScheduler")

    # ------------------------------------------------------------ loading

    def load(self, path: str, *, dtype: Any = None, device: Any = "cpu",
             config: str | None = None) -> Components:
        """Load from a diffusers folder, a hub id or a single-file .safetensors.

        `config` (single files only): a diffusers folder or hub id with the configs.
        Errors are `loading.ModelLoadError` whose message names the path.
        """
        dtype = loading.resolve_dtype(dtype)
        kind = loading.checked_source(path, self.name)
        if kind == "file":
            c = self._load_single_file(path, dtype, config)
        else:
            c = self._load_pretrained(path, kind, dtype)
        self._check_loaded(c)
        freeze((c.vae, c.denoiser, *c.text_encoders), device)
        return c

    def _load_pretrained(self, path: str, kind: loading.SourceKind, dtype: Any) -> Components:
        from diffusers import AutoencoderKL, DDPMScheduler, UNet2DConditionModel
        from transformers import CLIPTextModel, CLIPTokenizer

        load = loading.load_component
        return Components(
            family=self.name, source=path, fingerprint=loading.fingerprint(path, kind),
            vae=load(AutoencoderKL, path, kind, "vae", dtype),
            denoiser=load(UNet2DConditionModel, path, kind, "unet", dtype),
            text_encoders=[load(CLIPTextModel, path, kind, "text_encoder", dtype)],
            tokenizers=[load(CLIPTokenizer, path, kind, "tokenizer")],
            noise_scheduler=load(DDPMScheduler, path, kind, "scheduler"),
        )

    def _pipeline_class(self) -> Any:
        import diffusers

        return getattr(diffusers, self.pipeline_class_name)

    def _load_single_file(self, path: str, dtype: Any, config: str | None) -> Components:
        from diffusers import DDPMScheduler

        pipe = loading.load_single_file(self._pipeline_class(), path, self.name, dtype, config)
        return self._components_from_pipeline(
            pipe, path, loading.fingerprint(path, "file"),
            DDPMScheduler.from_config(pipe.scheduler.config))

    def _components_from_pipeline(self, pipe: Any, source: str, fp: str,
                                  scheduler: Any) -> Components:
        return Components(
            family=self.name, source=source, fingerprint=fp, vae=pipe.vae, denoiser=pipe.unet,
            text_encoders=[pipe.text_encoder], tokenizers=[pipe.tokenizer],
            noise_scheduler=scheduler)

    def set_prediction_type(self, c: Components, prediction_type: str) -> None:
        """Train against `prediction_type` ("epsilon" or "v_prediction") whatever the
        loaded scheduler config says; "auto" keeps the config's. The target
        (`noise_and_target`), the min-SNR weights and the validation scheduler all read
        the noise scheduler's config, so replacing the scheduler changes all three."""
        if prediction_type == "auto":
            return
        if prediction_type not in ("epsilon", "v_prediction"):
            raise ValueError(f"model.prediction_type must be auto, epsilon or v_prediction; "
                             f"got {prediction_type!r}")
        scheduler = c.noise_scheduler
        c.noise_scheduler = type(scheduler).from_config(scheduler.config,
                                                        prediction_type=prediction_type)

    def _check_loaded(self, c: Components) -> None:
        """Catch a mix-up of two of these families from the text width of real models
        (the family whose `text_width` it is)."""
        from core.models.registry import families

        width = c.denoiser.config.cross_attention_dim
        other = next((f.name for f in families() if getattr(f, "text_width", 0) == width),
                     None)
        if self.text_width and other and other != self.name:
            raise loading.ModelLoadError(c.source, f"looks like an {other} model (text width "
                                         f"{width}), not {self.name}: set model.family = "
                                         f"\"{other}\"")

    # ------------------------------------------------------------ text and images

    def _tokenize(self, tokenizer: Any, prompts: list[str]) -> Any:
        return tokenizer(prompts, padding="max_length", max_length=tokenizer.model_max_length,
                         truncation=True, return_tensors="pt")

    def encode_prompts(self, c: Components, prompts: list[str],
                       grad: bool = False) -> list[dict[str, Any]]:
        """One dict per prompt: prompt_embeds [77, D] and prompt_mask [77] (bool).
        grad: keep the graph (a text-encoder LoRA trains through it); the encoder may be
        wrapped for distributed training, so its device is read from the inner module."""
        import torch

        enc = c.text_encoders[0]
        tok = self._tokenize(c.tokenizers[0], prompts)
        with torch.set_grad_enabled(grad):
            embeds = enc(tok.input_ids.to(unwrap(enc).device))[0]
        mask = tok.attention_mask.bool()
        return [{"prompt_embeds": embeds[i], "prompt_mask": mask[i]}
                for i in range(len(prompts))]

    def encode_images(self, c: Components, pixels: Any, generator: Any = None) -> Any:
        """Scaled latents [B, 4, H/8, W/8] of pixels in [-1, 1] (see module docstring)."""
        return encode_latents(c.vae, pixels, generator)

    # ------------------------------------------------------------ training

    def noise_and_target(self, c: Components, latents: Any, generator: Any = None,
                         timesteps: Any = None, noise: Any = None,
                         noise_offset: float = 0.0) -> NoiseSample:
        """DDPM noise at random (or given) timesteps; target per the scheduler's
        prediction_type (epsilon: the noise; v_prediction: the velocity)."""
        noisy, t, target = ddpm_noise_and_target(
            c.noise_scheduler, latents, generator, timesteps, noise, noise_offset)
        return NoiseSample(noisy=noisy, timesteps=t, target=target)

    def _unet_kwargs(self, c: Components, sample: NoiseSample,
                     batch: dict[str, Any]) -> dict[str, Any]:
        """Conditioning beyond the text embeddings (SDXL's pooled embeds and size ids)."""
        return {}

    def predict(self, c: Components, sample: NoiseSample, batch: dict[str, Any]) -> Any:
        """UNet output for a collated batch; batch["prompt_embeds"] is [B, L, D]. The
        prompt_mask is not given to the UNet (see the module docstring)."""
        unet = c.denoiser
        dtype = unwrap(unet).dtype
        embeds = batch["prompt_embeds"].to(sample.noisy.device, dtype)
        return unet(sample.noisy.to(dtype), sample.timesteps, encoder_hidden_states=embeds,
                    return_dict=False, **self._unet_kwargs(c, sample, batch))[0]

    def loss(self, c: Components, prediction: Any, sample: NoiseSample,
             min_snr_gamma: float = 0.0) -> Any:
        """MSE against the target; min-SNR-gamma weighting when gamma > 0."""
        weights = sample.weights
        if min_snr_gamma and min_snr_gamma > 0:
            w = min_snr_weights(c.noise_scheduler, sample.timesteps, min_snr_gamma)
            weights = w if weights is None else weights * w
        return weighted_mse(prediction, sample.target, weights, sample.mask)

    def lora_target_modules(self, scope: str = "attention") -> list[str]:
        return LORA_TARGETS + (LORA_TARGETS_EXTRA if scope == "all" else [])

    def save_lora(self, c: Components, out_dir: Path,
                  kohya_name: str = "lora_kohya") -> dict[str, Path]:
        """pytorch_lora_weights.safetensors (diffusers; LoRA and DoRA only, see
        adapters.py) and <kohya_name>.safetensors (kohya/LyCORIS names, see lora_files.py)."""
        out_dir = Path(out_dir)
        peft_sd, config = adapter_weights(c.denoiser)
        kind = adapter_kind(config)
        layers = _diffusers_layers(peft_sd, kind)
        extra: dict[str, Any] = {}
        kohya = kohya_tensors(peft_sd, config, "unet", base_weights(c.denoiser))
        for name, encoder in zip(TEXT_ENCODER_NAMES, c.text_encoders, strict=False):
            if encoder is None or not has_adapter(encoder):
                continue
            te_sd, te_config = adapter_weights(encoder)
            te_sd = _text_model_names(te_sd, encoder)
            extra[f"{name}_lora_layers"] = _diffusers_layers(te_sd, kind)
            extra[f"{name}_lora_adapter_metadata"] = te_config.to_dict()
            kohya.update(kohya_tensors(te_sd, te_config, name,
                                       base_weights(encoder, strip="text_model.")))
        if self.text_encoder_count == 1:  # kohya names a single encoder lora_te_
            kohya = {k.replace("lora_te1_", "lora_te_", 1): v for k, v in kohya.items()}
        files: dict[str, Path] = {}
        if kind in DIFFUSERS_KINDS:
            save_fn = self._pipeline_class().save_lora_weights
            files["diffusers"] = save_diffusers_lora(save_fn, "unet_lora_layers", layers,
                                                     config, out_dir, extra)
        else:
            out_dir.mkdir(parents=True, exist_ok=True)
        files["kohya"] = write_kohya(kohya, config, out_dir / f"{kohya_name}.safetensors")
        return files

    # ------------------------------------------------------------ validation

    def validation_scheduler(self, c: Components) -> Any:
        """DPM-Solver++ from the training schedule: good images in ~20 steps."""
        from diffusers import DPMSolverMultistepScheduler

        return DPMSolverMultistepScheduler.from_config(c.noise_scheduler.config)

    def validation_pipeline(self, c: Components) -> Any:
        """A StableDiffusionPipeline sharing the loaded modules (no safety checker)."""
        from diffusers import StableDiffusionPipeline

        pipe = StableDiffusionPipeline(
            vae=c.vae, text_encoder=c.text_encoders[0], tokenizer=c.tokenizers[0],
            unet=unwrap(c.denoiser), scheduler=self.validation_scheduler(c),
            safety_checker=None, feature_extractor=None, requires_safety_checker=False)
        pipe.set_progress_bar_config(disable=True)
        return pipe


def _diffusers_layers(peft_sd: dict[str, Any], kind: str) -> dict[str, Any]:
    """The layers for save_lora_weights: LoRA in diffusers' names, as diffusers'
    train_dreambooth_lora.py writes; DoRA in PEFT's, which load_lora_weights also reads
    (convert_state_dict_to_diffusers loses the magnitude of DoRA convolutions: such a file
    reloads with missing weights)."""
    from diffusers.utils import convert_state_dict_to_diffusers

    return convert_state_dict_to_diffusers(peft_sd) if kind == "lora" else dict(peft_sd)


def _text_model_names(peft_sd: dict[str, Any], encoder: Any) -> dict[str, Any]:
    """CLIP module names as the LoRA files in the wild have them, "text_model.encoder...":
    transformers 5's CLIP text models dropped the `text_model` level. diffusers strips the
    prefix again when it loads into such a model (lora_base.py), and ComfyUI's kohya
    names (lora_te_text_model_encoder_layers_...) need it."""
    if hasattr(unwrap(encoder), "text_model"):
        return peft_sd
    return {f"text_model.{key}": value for key, value in peft_sd.items()}

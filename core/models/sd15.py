"""Stable Diffusion 1.x: UNet + one CLIP text encoder, epsilon prediction.

`StableDiffusionFamily` is also the base of sd2 (same architecture, v-prediction) and
sdxl (two encoders, pooled embeds, size/crop ids), which override the parts that differ.

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

from core.models import common
from core.models.base import Components, NoiseSample
from core.models.tokenizers import CLIP_VOCAB_SIZE, build_clip_tokenizer, clip_vocab

LORA_TARGETS = ["to_k", "to_q", "to_v", "to_out.0"]
# LoCon-style extras: the resnets' convolutions, time projections, transformer in/out
# projections and feed-forwards (not conv_in/conv_out).
LORA_TARGETS_EXTRA = ["conv1", "conv2", "conv_shortcut", "time_emb_proj", "proj_in", "proj_out",
                      "ff.net.0.proj", "ff.net.2"]


def tiny_clip_config(hidden_size: int = 32, hidden_act: str = "quick_gelu",
                     projection_dim: int = 32, layers: int = 3) -> Any:
    """A CLIPTextConfig matching the byte-level tiny tokenizer."""
    from transformers import CLIPTextConfig

    vocab = clip_vocab()
    return CLIPTextConfig(
        vocab_size=CLIP_VOCAB_SIZE, hidden_size=hidden_size, intermediate_size=hidden_size * 2,
        num_hidden_layers=layers, num_attention_heads=4, max_position_embeddings=77,
        hidden_act=hidden_act, projection_dim=projection_dim,
        bos_token_id=vocab["<|startoftext|>"], eos_token_id=vocab["<|endoftext|>"],
        pad_token_id=vocab["<|endoftext|>"],
    )


def tiny_vae(scaling_factor: float = 0.18215) -> Any:
    """AutoencoderKL with 4 blocks: spatial scale factor 8, 4 latent channels."""
    from diffusers import AutoencoderKL

    return AutoencoderKL(
        in_channels=3, out_channels=3, latent_channels=4,
        down_block_types=("DownEncoderBlock2D",) * 4, up_block_types=("UpDecoderBlock2D",) * 4,
        block_out_channels=(8, 16, 32, 32), layers_per_block=1, norm_num_groups=8,
        sample_size=128, scaling_factor=scaling_factor,
    )


class StableDiffusionFamily:
    """SD 1.x; subclasses change the class attributes and override what differs."""

    name = "sd15"
    prediction = "epsilon"
    text_encoder_count = 1
    pipeline_class_name = "StableDiffusionPipeline"
    default_resolution = 512
    vae_scaling_factor = 0.18215
    tiny_pad_token = "<|endoftext|>"

    # ------------------------------------------------------------ tiny model

    def tiny_scheduler(self) -> Any:
        from diffusers import PNDMScheduler

        return PNDMScheduler(beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear",
                             num_train_timesteps=1000, skip_prk_steps=True,
                             set_alpha_to_one=False, steps_offset=1,
                             prediction_type=self.prediction)

    def tiny_unet(self) -> Any:
        from diffusers import UNet2DConditionModel

        return UNet2DConditionModel(
            sample_size=16, in_channels=4, out_channels=4, layers_per_block=2,
            block_out_channels=(32, 64),
            down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"),
            up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"),
            **{"cross_attention_dim": 32, **self.tiny_unet_extra()},
        )

    def tiny_unet_extra(self) -> dict[str, Any]:
        return {}

    def build_tiny(self, out_dir: Path, seed: int = 0) -> None:
        """Write a tiny random model as a diffusers folder; same seed, same bytes."""
        out_dir = Path(out_dir)
        parts = self.tiny_components(out_dir, seed)
        pipe = self._pipeline_class()(**parts)
        pipe.save_pretrained(str(out_dir), safe_serialization=True)

    def tiny_components(self, out_dir: Path, seed: int) -> dict[str, Any]:
        """Pipeline constructor arguments; tokenizers are written to out_dir first."""
        import torch
        from transformers import CLIPTextModel, CLIPTokenizer

        torch.manual_seed(seed)
        unet = self.tiny_unet()
        torch.manual_seed(seed + 1)
        vae = tiny_vae(self.vae_scaling_factor)
        common.calibrate_tiny_vae(vae, seed)
        torch.manual_seed(seed + 2)
        text_encoder = CLIPTextModel(self.tiny_text_config())
        build_clip_tokenizer(out_dir / "tokenizer", pad_token=self.tiny_pad_token)
        tokenizer = CLIPTokenizer.from_pretrained(str(out_dir / "tokenizer"),
                                                  local_files_only=True)
        return {"vae": vae, "text_encoder": text_encoder, "tokenizer": tokenizer, "unet": unet,
                "scheduler": self.tiny_scheduler(), "safety_checker": None,
                "feature_extractor": None, "requires_safety_checker": False}

    def tiny_text_config(self) -> Any:
        return tiny_clip_config()

    # ------------------------------------------------------------ loading

    def load(self, path: str, *, dtype: Any = None, device: Any = "cpu",
             config: str | None = None) -> Components:
        """Load from a diffusers folder, a hub id or a single-file .safetensors.

        `config` (single files only): a diffusers folder or hub id with the configs.
        Errors are `common.ModelLoadError` whose message names the path.
        """
        dtype = common.resolve_dtype(dtype)
        kind = common.classify_source(path)
        if kind == "file":
            c = self._load_single_file(path, dtype, config)
        else:
            if kind == "folder":
                common.check_folder_family(path, self.name)
            c = self._load_pretrained(path, kind, dtype)
        self._check_loaded(c)
        for module in (c.vae, c.denoiser, *c.text_encoders):
            module.to(device)
            module.requires_grad_(False)
        c.text_encoders = [t.eval() for t in c.text_encoders]
        c.vae.eval()
        return c

    def _load_pretrained(self, path: str, kind: common.SourceKind, dtype: Any) -> Components:
        from diffusers import AutoencoderKL, DDPMScheduler, UNet2DConditionModel
        from transformers import CLIPTextModel, CLIPTokenizer

        load = common.load_component
        return Components(
            family=self.name, source=path, fingerprint=common.fingerprint(path, kind),
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

        pipe = common.load_single_file(self._pipeline_class(), path, self.name, dtype, config)
        return self._components_from_pipeline(
            pipe, path, common.fingerprint(path, "file"),
            DDPMScheduler.from_config(pipe.scheduler.config))

    def _components_from_pipeline(self, pipe: Any, source: str, fp: str,
                                  scheduler: Any) -> Components:
        return Components(
            family=self.name, source=source, fingerprint=fp, vae=pipe.vae, denoiser=pipe.unet,
            text_encoders=[pipe.text_encoder], tokenizers=[pipe.tokenizer],
            noise_scheduler=scheduler)

    def _check_loaded(self, c: Components) -> None:
        """Catch an SD1/SD2 mix-up from the text width (768 vs 1024) of real models."""
        width = c.denoiser.config.cross_attention_dim
        other = {768: "sd15", 1024: "sd2"}.get(width)
        if self.name in ("sd15", "sd2") and other and other != self.name:
            raise common.ModelLoadError(c.source, f"looks like an {other} model (text width "
                                        f"{width}), not {self.name}: set model.family = "
                                        f"\"{other}\"")

    # ------------------------------------------------------------ text and images

    def _tokenize(self, tokenizer: Any, prompts: list[str]) -> Any:
        return tokenizer(prompts, padding="max_length", max_length=tokenizer.model_max_length,
                         truncation=True, return_tensors="pt")

    def encode_prompts(self, c: Components, prompts: list[str]) -> list[dict[str, Any]]:
        """One dict per prompt: prompt_embeds [77, D] and prompt_mask [77] (bool)."""
        import torch

        enc = c.text_encoders[0]
        tok = self._tokenize(c.tokenizers[0], prompts)
        with torch.no_grad():
            embeds = enc(tok.input_ids.to(enc.device))[0]
        mask = tok.attention_mask.bool()
        return [{"prompt_embeds": embeds[i], "prompt_mask": mask[i]}
                for i in range(len(prompts))]

    def encode_images(self, c: Components, pixels: Any, generator: Any = None) -> Any:
        """Scaled latents [B, 4, H/8, W/8] of pixels in [-1, 1] (see module docstring)."""
        return common.encode_latents(c.vae, pixels, generator)

    # ------------------------------------------------------------ training

    def noise_and_target(self, c: Components, latents: Any, generator: Any = None,
                         timesteps: Any = None, noise: Any = None) -> NoiseSample:
        """DDPM noise at random (or given) timesteps; target per the scheduler's
        prediction_type (epsilon: the noise; v_prediction: the velocity)."""
        noisy, t, target = common.ddpm_noise_and_target(
            c.noise_scheduler, latents, generator, timesteps, noise)
        return NoiseSample(noisy=noisy, timesteps=t, target=target)

    def _unet_kwargs(self, c: Components, sample: NoiseSample, text: dict[str, Any],
                     extra: dict[str, Any] | None) -> dict[str, Any]:
        return {}

    def predict(self, c: Components, sample: NoiseSample, text: dict[str, Any],
                extra: dict[str, Any] | None = None) -> Any:
        """UNet output for a collated batch; text["prompt_embeds"] is [B, L, D]."""
        unet = c.denoiser
        dtype = common.unwrap(unet).dtype
        embeds = text["prompt_embeds"].to(sample.noisy.device, dtype)
        return unet(sample.noisy.to(dtype), sample.timesteps, encoder_hidden_states=embeds,
                    return_dict=False, **self._unet_kwargs(c, sample, text, extra))[0]

    def loss(self, c: Components, prediction: Any, sample: NoiseSample,
             min_snr_gamma: float = 0.0) -> Any:
        """MSE against the target; min-SNR-gamma weighting when gamma > 0."""
        weights = sample.weights
        if min_snr_gamma and min_snr_gamma > 0:
            w = common.min_snr_weights(c.noise_scheduler, sample.timesteps, min_snr_gamma)
            weights = w if weights is None else weights * w
        return common.weighted_mse(prediction, sample.target, weights)

    def lora_target_modules(self, scope: str = "attention") -> list[str]:
        return LORA_TARGETS + (LORA_TARGETS_EXTRA if scope == "all" else [])

    def save_lora(self, c: Components, out_dir: Path,
                  kohya_name: str = "lora_kohya") -> dict[str, Path]:
        """pytorch_lora_weights.safetensors (diffusers) and <kohya_name>.safetensors."""
        return common.save_lora_files(self._pipeline_class().save_lora_weights,
                                      "unet_lora_layers", c.denoiser, Path(out_dir),
                                      kohya_prefix="unet", kohya_name=kohya_name)

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
            unet=common.unwrap(c.denoiser), scheduler=self.validation_scheduler(c),
            safety_checker=None, feature_extractor=None, requires_safety_checker=False)
        pipe.set_progress_bar_config(disable=True)
        return pipe


FAMILY = StableDiffusionFamily()

"""Flow matching (rectified flow), shared by the SD3 and Flux families.

Forward process, as in diffusers' train_dreambooth_lora_sd3.py / _flux.py:
    noisy  = (1 - sigma) * latents + sigma * noise
    target = noise - latents                (the velocity the transformer predicts)
with sigma in (0, 1) per item. The denoiser is given `timesteps = sigma * 1000`, the scale
of FlowMatchEulerDiscreteScheduler.timesteps (Flux's predict divides by 1000 again, as
FluxPipeline does).

Sigma sampling (`FlowFamily.timestep_sampling`):
- "logit_normal" (default): sigma = sigmoid(N(logit_mean, logit_std)), the SD3 paper's
  choice (Esser et al. 2024, "rf/lognorm(0.00, 1.00)"); also kohya's/SimpleTuner's
  "sigmoid" sampling for Flux. Concentrates training on middle noise levels.
- "uniform": sigma ~ U(0, 1), diffusers' Flux script default ("none" weighting scheme).
Then the family's shift: sigma' = s*sigma / (1 + (s-1)*sigma). SD3 uses its scheduler's
`shift` (3.0 for SD3 medium), like diffusers' SD3 script, which indexes the shifted
scheduler sigmas; Flux's scheduler uses dynamic (resolution-dependent) shifting at
inference, and diffusers' Flux script trains unshifted, so Flux uses shift 1.
Sigmas are clamped to [1e-3, 1 - 1e-3] so neither the clean nor the pure-noise end is
degenerate.

Loss weighting (`FlowFamily.loss_weighting`): "none" (default), "sigma_sqrt" (sigma^-2)
or "cosmap" (2 / (pi * (1 - 2 sigma + 2 sigma^2))), the schemes of diffusers'
`compute_loss_weighting_for_sd3`. min_snr_gamma does not apply to flow matching and is
ignored (SNR weighting is a DDPM notion; the schemes above are its flow counterparts).

Text: both families encode prompts through their pipeline's own `encode_prompt`, at a
fixed length (CLIP 77, T5 `max_sequence_length`) padded exactly as the pipelines pad, so
every prompt has the same L and collate never pads; the transformers take no text mask,
like the pipelines, and `prompt_mask` only marks the real (non-pad) tokens.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

from core.models import common
from core.models.base import Components, NoiseSample

SIGMA_EPS = 1e-3
TIMESTEP_SAMPLINGS = ("logit_normal", "uniform")
LOSS_WEIGHTINGS = ("none", "sigma_sqrt", "cosmap")


# ---------------------------------------------------------------- sigmas, noise, loss


def shift_sigmas(sigmas: Any, shift: float) -> Any:
    """The scheduler's static shift: more weight on high noise for shift > 1."""
    if shift == 1.0:
        return sigmas
    return shift * sigmas / (1.0 + (shift - 1.0) * sigmas)


def sample_sigmas(n: int, generator: Any = None, device: Any = "cpu",
                  scheme: str = "logit_normal", logit_mean: float = 0.0,
                  logit_std: float = 1.0, shift: float = 1.0) -> Any:
    """n sigmas in (0, 1) drawn with `generator` on its own device, then moved."""
    import torch

    gen_device = generator.device if generator is not None else device
    if scheme == "logit_normal":
        normal = torch.randn(n, generator=generator, device=gen_device, dtype=torch.float32)
        u = torch.sigmoid(normal * logit_std + logit_mean)
    elif scheme == "uniform":
        u = torch.rand(n, generator=generator, device=gen_device, dtype=torch.float32)
    else:
        raise ValueError(f"unknown timestep sampling {scheme!r}; use one of "
                         f"{', '.join(TIMESTEP_SAMPLINGS)}")
    u = u.clamp(SIGMA_EPS, 1.0 - SIGMA_EPS)
    return shift_sigmas(u, shift).to(device)


def loss_weights(sigmas: Any, scheme: str) -> Any | None:
    """Per-item weights of diffusers' compute_loss_weighting_for_sd3; None for "none"."""
    if scheme == "none":
        return None
    if scheme == "sigma_sqrt":
        return (sigmas.float() ** -2.0)
    if scheme == "cosmap":
        bot = 1.0 - 2.0 * sigmas.float() + 2.0 * sigmas.float() ** 2
        return 2.0 / (math.pi * bot)
    raise ValueError(f"unknown loss weighting {scheme!r}; use one of {', '.join(LOSS_WEIGHTINGS)}")


def flow_noise_and_target(latents: Any, sigmas: Any, noise: Any) -> tuple[Any, Any]:
    """(noisy, target) of the rectified-flow forward process, computed in float32."""
    s = sigmas.float().reshape(-1, *([1] * (latents.ndim - 1))).to(latents.device)
    x = latents.float()
    n = noise.float().to(latents.device)
    noisy = (1.0 - s) * x + s * n
    return noisy.to(latents.dtype), (n - x).to(latents.dtype)


# ---------------------------------------------------------------- tiny parts


def tiny_flow_vae(scaling_factor: float, shift_factor: float) -> Any:
    """AutoencoderKL like SD3's/Flux's: 16 latent channels, no quant convs, scale 8."""
    from diffusers import AutoencoderKL

    return AutoencoderKL(
        in_channels=3, out_channels=3, latent_channels=16,
        down_block_types=("DownEncoderBlock2D",) * 4, up_block_types=("UpDecoderBlock2D",) * 4,
        block_out_channels=(8, 16, 32, 32), layers_per_block=1, norm_num_groups=8,
        sample_size=128, scaling_factor=scaling_factor, shift_factor=shift_factor,
        use_quant_conv=False, use_post_quant_conv=False,
    )


# ---------------------------------------------------------------- the shared family


class FlowFamily:
    """What SD3 and Flux share; subclasses set the class attributes and the text/predict
    parts. Training knobs are attributes so a trainer may override them per instance."""

    name = "flow"
    prediction = "flow_matching"
    text_encoder_count = 2
    pipeline_class_name = ""
    transformer_lora_kwarg = "transformer_lora_layers"
    default_max_sequence_length = 256  # the pipeline's own default
    timestep_sampling = "logit_normal"
    logit_mean = 0.0
    logit_std = 1.0
    loss_weighting = "none"

    # ------------------------------------------------------------ loading

    def _pipeline_class(self) -> Any:
        import diffusers

        return getattr(diffusers, self.pipeline_class_name)

    def load(self, path: str, *, dtype: Any = None, device: Any = "cpu",
             config: str | None = None) -> Components:
        """Load from a diffusers folder, a hub id or a single-file .safetensors.

        `config` (single files only): a diffusers folder or hub id holding the configs
        and any component the file lacks (Flux files usually hold only the transformer).
        Errors are `common.ModelLoadError` whose message names the path.
        """
        dtype = common.resolve_dtype(dtype)
        kind = common.classify_source(path)
        if kind == "file":
            pipe = common.load_single_file(self._pipeline_class(), path, self.name, dtype,
                                           config)
        else:
            if kind == "folder":
                common.check_folder_family(path, self.name)
            pipe = self._from_pretrained(path, kind, dtype)
        c = self._components_from_pipeline(pipe, path, common.fingerprint(path, kind))
        for module in (c.vae, c.denoiser, *c.text_encoders):
            if module is not None:
                module.to(device)
                module.requires_grad_(False)
                module.eval()
        return c

    def _missing_optional(self, path: str) -> dict[str, Any]:
        """Components a folder may leave out, passed as None (SD3 without its T5)."""
        return {}

    def _from_pretrained(self, path: str, kind: common.SourceKind, dtype: Any) -> Any:
        kwargs: dict[str, Any] = {}
        if dtype is not None:
            kwargs["torch_dtype"] = dtype
        if kind == "folder":
            kwargs.update(self._missing_optional(path))
        try:
            return self._pipeline_class().from_pretrained(
                path, local_files_only=(kind == "folder"), **kwargs)
        except Exception as exc:  # noqa: BLE001 - every loader failure becomes one message
            if kind == "hub":
                raise common.hub_error(path, f"the {self.name} model", exc) from exc
            raise common.ModelLoadError(path, f"cannot load this {self.name} diffusers "
                                        f"folder: {type(exc).__name__}: {str(exc)[:300]}"
                                        ) from exc

    def _components_from_pipeline(self, pipe: Any, source: str, fp: str) -> Components:
        raise NotImplementedError

    @property
    def max_sequence_length(self) -> int:
        return self.default_max_sequence_length

    # ------------------------------------------------------------ images

    def encode_images(self, c: Components, pixels: Any, generator: Any = None) -> Any:
        """(latents - shift_factor) * scaling_factor of pixels in [-1, 1], [B, 16, H/8, W/8].

        Without a generator: the posterior mean (deterministic caches); with one: a
        posterior sample, what diffusers' training scripts do.
        """
        return common.encode_latents(c.vae, pixels, generator)

    # ------------------------------------------------------------ training

    def train_shift(self, c: Components) -> float:
        """The static sigma shift used in training (see the module docstring)."""
        cfg = c.noise_scheduler.config
        return 1.0 if cfg.get("use_dynamic_shifting", False) else float(cfg.get("shift", 1.0))

    def noise_and_target(self, c: Components, latents: Any, generator: Any = None,
                         timesteps: Any = None, noise: Any = None) -> NoiseSample:
        """Flow-matching sample. `timesteps` (optional, scheduler scale 0..1000, a scalar
        or [B]) fixes sigma = timesteps / 1000 and `noise` fixes the noise, for a
        deterministic evaluation; otherwise both are drawn with `generator`."""
        import torch

        b = latents.shape[0]
        n_train = int(c.noise_scheduler.config.get("num_train_timesteps", 1000))
        gen_device = generator.device if generator is not None else latents.device
        if noise is None:
            noise = torch.randn(latents.shape, generator=generator, device=gen_device,
                                dtype=torch.float32).to(latents.device)
        if timesteps is None:
            sigmas = sample_sigmas(b, generator, latents.device, self.timestep_sampling,
                                   self.logit_mean, self.logit_std, self.train_shift(c))
        else:
            t = torch.as_tensor(timesteps, dtype=torch.float32).reshape(-1).to(latents.device)
            sigmas = (t / n_train).expand(b) if t.numel() == 1 else t / n_train
            sigmas = sigmas.clamp(SIGMA_EPS, 1.0 - SIGMA_EPS)
        noisy, target = flow_noise_and_target(latents, sigmas, noise)
        return NoiseSample(noisy=noisy, timesteps=sigmas * n_train, target=target,
                           weights=loss_weights(sigmas, self.loss_weighting))

    def check_text_length(self, text: dict[str, Any], expected: int) -> None:
        """Embeddings always have the fixed length; another means a stale text cache."""
        got = text["prompt_embeds"].shape[1]
        if got != expected:
            raise ValueError(f"{self.name} prompt embeddings have {got} tokens, expected "
                             f"{expected}: the text cache was built with another "
                             "max_sequence_length or model; delete the text cache to rebuild")

    def loss(self, c: Components, prediction: Any, sample: NoiseSample,
             min_snr_gamma: float = 0.0) -> Any:
        """Per-item MSE against noise - latents, weighted by sample.weights, batch mean.
        min_snr_gamma is ignored: it is not defined for flow matching."""
        return common.weighted_mse(prediction, sample.target, sample.weights)

    # ------------------------------------------------------------ LoRA

    def save_lora(self, c: Components, out_dir: Path) -> dict[str, Path]:
        """pytorch_lora_weights.safetensors (diffusers; PEFT key names and the LoRA config
        as metadata, as diffusers' dreambooth scripts write) and lora_comfyui.safetensors
        (the same keys plus one `.alpha` per module, which ComfyUI reads for the scale)."""
        out_dir = Path(out_dir)
        out_dir.mkdir(parents=True, exist_ok=True)
        model = common.unwrap(c.denoiser)
        peft_sd = common.lora_state_dict(model)
        config = model.peft_config["default"]
        meta_kwarg = self.transformer_lora_kwarg.replace("_lora_layers", "_lora_adapter_metadata")
        self._pipeline_class().save_lora_weights(
            str(out_dir), **{self.transformer_lora_kwarg: peft_sd, meta_kwarg: config.to_dict()})
        return {"diffusers": out_dir / "pytorch_lora_weights.safetensors",
                "comfyui": save_comfy_lora(peft_sd, config, out_dir / "lora_comfyui.safetensors")}

    # ------------------------------------------------------------ validation

    def validation_scheduler(self, c: Components) -> Any:
        from diffusers import FlowMatchEulerDiscreteScheduler

        return FlowMatchEulerDiscreteScheduler.from_config(c.noise_scheduler.config)


def module_alpha(config: Any, module: str) -> float:
    """The lora_alpha PEFT used for `module`, honouring alpha_pattern/rank_pattern."""
    alpha = float(config.lora_alpha)
    for pattern, value in (getattr(config, "alpha_pattern", None) or {}).items():
        if module == pattern or module.endswith("." + pattern):
            alpha = float(value)
    return alpha


def save_comfy_lora(peft_sd: dict[str, Any], config: Any, path: Path) -> Path:
    """Write the LoRA with diffusers-style names ("transformer.<module>.lora_A/B.weight")
    and "transformer.<module>.alpha".

    ComfyUI maps "transformer.<diffusers module>" keys of SD3 and Flux to its own
    weights (comfy/lora.py: mmdit_to_diffusers / flux_to_diffusers) and accepts
    lora_A/lora_B names, scaling each module by alpha / rank (1.0 when alpha is absent),
    so writing alpha makes alpha != rank come out as PEFT trained it.
    """
    import torch
    from safetensors.torch import save_file

    tensors: dict[str, Any] = {}
    for key, value in peft_sd.items():
        tensors[f"transformer.{key}"] = value.detach().to("cpu").contiguous()
        if key.endswith(".lora_A.weight"):
            module = key[: -len(".lora_A.weight")]
            alpha = module_alpha(config, module)
            tensors[f"transformer.{module}.alpha"] = torch.tensor(alpha)
    tmp = path.with_name(path.name + ".tmp")
    save_file(tensors, str(tmp), metadata={"format": "pt", "ss_network_dim": str(config.r),
                                           "ss_network_alpha": str(config.lora_alpha)})
    os.replace(tmp, path)
    return path

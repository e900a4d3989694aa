"""Training objectives: how latents are noised, what the denoiser's output is compared
with, and how each item's loss is weighted. Pure tensor maths, no model classes.

DDPM (sd15, sd2, sdxl): the scheduler's forward process at a timestep in [0, 1000); the
target is the noise (epsilon) or the velocity (v_prediction), as the loaded scheduler's
`prediction_type` says. Min-SNR-gamma weighting (Hang et al. 2023) is optional.

Flow matching (sd3, flux), the rectified flow of diffusers' train_dreambooth_lora_sd3.py
and _flux.py:
    noisy  = (1 - sigma) * latents + sigma * noise
    target = noise - latents                (the velocity the transformer predicts)
with sigma in (0, 1) per item, drawn by `sample_sigmas` (train.timestep_sampling); u is
drawn as diffusers' training_utils.compute_density_for_timestep_sampling draws it:
- "logit_normal": sigma = sigmoid(N(logit_mean, logit_std)), the SD3 paper's choice
  (Esser et al. 2024, "rf/lognorm(0.00, 1.00)"). Concentrates training on middle noise.
- "uniform": sigma ~ U(0, 1), diffusers' Flux script default ("none" weighting scheme).
- "mode": the SD3 paper's mode sampling, u ~ U(0, 1),
  sigma = 1 - u - mode_scale * (cos^2(pi u / 2) - 1 + u) (scale 1.29 as diffusers).
- "sigmoid": kohya sd-scripts' and SimpleTuner's name for the logit-normal draw
  sigmoid(logit_std * N(0, 1) + logit_mean), taken as drawn: never shifted (kohya applies
  its discrete_flow_shift only to its "shift" sampling).
then (all but "sigmoid") shifted by the run's or family's static shift:
sigma' = s*sigma / (1 + (s-1)*sigma), and clamped to [1e-3, 1 - 1e-3] so neither the clean
nor the pure-noise end is degenerate. diffusers' scripts index their descending sigma
table with u, so their sigma is about 1 - u: the same law for uniform, mode (symmetric
about 1/2) and logit_normal at mean 0; with logit_mean > 0 theirs favours low noise and
this project's (the SD3 paper's convention) high noise.
`loss_weights` gives diffusers' `compute_loss_weighting_for_sd3` schemes: "none",
"sigma_sqrt" (sigma^-2) or "cosmap" (2 / (pi * (1 - 2 sigma + 2 sigma^2))); they are the
flow counterparts of min-SNR, which does not apply to flow matching.

Random draws use the generator on its own device and then move, so a CPU generator gives
the same draws whatever device trains.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

SIGMA_EPS = 1e-3
TIMESTEP_SAMPLINGS = ("logit_normal", "uniform", "mode", "sigmoid")
LOSS_WEIGHTINGS = ("none", "sigma_sqrt", "cosmap")
MODE_SCALE = 1.29  # diffusers' scripts' --mode_scale default


@dataclass(frozen=True)
class FlowTraining:
    """A run's flow-matching choices (train.timestep_sampling, ...), kept on the loaded
    model (`Components.flow`). None means the family's own default (FlowFamily's class
    attributes and its scheduler's shift)."""

    timestep_sampling: str | None = None
    logit_mean: float | None = None
    logit_std: float | None = None
    mode_scale: float | None = None
    shift: float | None = None
    loss_weighting: str | None = None


def standard_noise(shape: Any, generator: Any, device: Any) -> Any:
    """float32 N(0, 1) noise of `shape`, drawn on the generator's device, moved to `device`."""
    import torch

    draw_on = generator.device if generator is not None else device
    return torch.randn(shape, generator=generator, device=draw_on,
                       dtype=torch.float32).to(device)


def weighted_mse(prediction: Any, target: Any, weights: Any | None = None,
                 mask: Any | None = None) -> Any:
    """Per-item MSE in float32, optionally masked and weighted, then the batch mean."""
    error = (prediction.float() - target.float()) ** 2
    if mask is None:
        per_item = error.reshape(prediction.shape[0], -1).mean(dim=1)
    else:
        per_item = masked_mean(error, mask)
    if weights is not None:
        per_item = per_item * weights.to(per_item.device, per_item.dtype)
    return per_item.mean()


def masked_mean(error: Any, mask: Any) -> Any:
    """Per-item mean of `error` [B, C, H, W] over the mask's area (datasets.N.masks):
    sum(error * mask) / (sum(mask) * C), mask [B, 1, H, W] in [0, 1]. An all-black mask
    gives exactly 0 (and a zero gradient), not 0/0. Video latents [B, C, F, H, W] take
    the same mask on every frame."""
    m = mask.to(error.device, error.dtype)
    while m.ndim < error.ndim:
        m = m.unsqueeze(2)
    b = error.shape[0]
    total = (error * m).reshape(b, -1).sum(dim=1)
    area = (m.expand_as(error)).reshape(b, -1).sum(dim=1)
    # Dividing by a clamped area keeps every branch finite (torch.where would still
    # propagate a NaN gradient from 0/0); total is 0 wherever area is 0.
    return total / area.clamp(min=1e-12)


# ---------------------------------------------------------------- DDPM


def offset_noise(noise: Any, offset: float, generator: Any = None) -> Any:
    """`noise` plus offset * N(0, 1) constant over each image's channel."""
    if offset <= 0:
        return noise
    shift = standard_noise((noise.shape[0], noise.shape[1], *([1] * (noise.ndim - 2))),
                           generator, noise.device)
    return (noise.float() + offset * shift).to(noise.dtype)


def ddpm_noise_and_target(scheduler: Any, latents: Any, generator: Any = None,
                          timesteps: Any = None, noise: Any = None,
                          noise_offset: float = 0.0) -> tuple[Any, Any, Any]:
    """DDPM forward process: (noisy, timesteps, target) for epsilon or v prediction.
    Draws what is not given: noise (offset by `noise_offset` when drawn here; given
    noise is used as is), and timesteps uniform over the training schedule."""
    import torch

    b = latents.shape[0]
    if noise is None:
        noise = standard_noise(latents.shape, generator, latents.device).to(latents.dtype)
        noise = offset_noise(noise, noise_offset, generator)
    if timesteps is None:
        n = scheduler.config.num_train_timesteps
        draw_on = generator.device if generator is not None else latents.device
        timesteps = torch.randint(0, n, (b,), generator=generator, device=draw_on)
    timesteps = torch.as_tensor(timesteps, device=latents.device).long().reshape(-1)
    if timesteps.numel() == 1 and b > 1:
        timesteps = timesteps.expand(b)
    noisy = scheduler.add_noise(latents, noise, timesteps)
    kind = scheduler.config.prediction_type
    if kind == "epsilon":
        target = noise
    elif kind == "v_prediction":
        target = scheduler.get_velocity(latents, noise, timesteps)
    else:
        raise ValueError(f"unsupported prediction_type {kind!r} in the scheduler config")
    return noisy, timesteps, target


def snr(scheduler: Any, timesteps: Any) -> Any:
    """Signal-to-noise ratio alpha_bar / (1 - alpha_bar) at each timestep."""
    alphas = scheduler.alphas_cumprod.to(timesteps.device)[timesteps].float()
    return alphas / (1.0 - alphas)


def min_snr_weights(scheduler: Any, timesteps: Any, gamma: float) -> Any:
    """Min-SNR-gamma loss weights for the scheduler's prediction type.

    epsilon: min(snr, gamma) / snr; v_prediction: min(snr, gamma) / (snr + 1), because
    the v loss already carries a factor (snr + 1) relative to the x0 loss.
    """
    import torch

    s = snr(scheduler, timesteps)
    clipped = torch.minimum(s, torch.full_like(s, gamma))
    if scheduler.config.prediction_type == "v_prediction":
        return clipped / (s + 1.0)
    return clipped / s.clamp(min=1e-8)


# ---------------------------------------------------------------- flow matching


def shift_sigmas(sigmas: Any, shift: float) -> Any:
    """The scheduler's static shift: more weight on high noise for shift > 1."""
    if shift == 1.0:
        return sigmas
    return shift * sigmas / (1.0 + (shift - 1.0) * sigmas)


def sample_sigmas(n: int, generator: Any = None, device: Any = "cpu",
                  scheme: str = "logit_normal", logit_mean: float = 0.0,
                  logit_std: float = 1.0, shift: float = 1.0,
                  mode_scale: float = MODE_SCALE) -> Any:
    """n sigmas in (0, 1) drawn with `generator` on its own device, then moved."""
    u = timestep_density(n, generator, device, scheme, logit_mean, logit_std, mode_scale)
    u = u.clamp(SIGMA_EPS, 1.0 - SIGMA_EPS)
    if scheme == "sigmoid":  # taken as drawn (see the module docstring)
        return u.to(device)
    return shift_sigmas(u, shift).to(device)


def timestep_density(n: int, generator: Any = None, device: Any = "cpu",
                     scheme: str = "logit_normal", logit_mean: float = 0.0,
                     logit_std: float = 1.0, mode_scale: float = MODE_SCALE) -> Any:
    """u in [0, 1] as compute_density_for_timestep_sampling draws it (tests compare the
    two), on the generator's device. logit-normal is randn * std + mean, which equals
    torch.normal(mean, std) up to rounding and keeps earlier runs' draws."""
    import torch

    gen_device = generator.device if generator is not None else device
    if scheme in ("logit_normal", "sigmoid"):
        normal = torch.randn(n, generator=generator, device=gen_device, dtype=torch.float32)
        return torch.sigmoid(normal * logit_std + logit_mean)
    if scheme not in ("uniform", "mode"):
        raise ValueError(f"unknown timestep sampling {scheme!r}; use one of "
                         f"{', '.join(TIMESTEP_SAMPLINGS)}")
    u = torch.rand(n, generator=generator, device=gen_device, dtype=torch.float32)
    if scheme == "mode":
        u = 1 - u - mode_scale * (torch.cos(math.pi * u / 2) ** 2 - 1 + u)
    return u


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

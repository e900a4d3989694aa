"""LTX-2's training objective, video and audio together, as LTX2Pipeline samples them.

Both streams are rectified flow at one sigma per sample: noisy = (1 - s) x + s n, the
transformer's output compared with n - x (the velocity the pipeline integrates: its
`convert_velocity_to_x0` is x0 = noisy - s v). The video half is FlowFamily's; this module
adds the audio half: the cached audio latents (audio.py) noised at the same sigma (the
pipeline steps both schedulers with the same sigmas), with their own noise.

A sample without an audio track (a still, a silent clip, `datasets.N.audio = false`)
still gives the transformer its audio tokens, as many as the pipeline samples beside its
frames, as pure noise at sigma 1 (timestep 1000: what the audio stream holds at the first
sampling step) and takes no audio loss: the video learns beside an audio track that tells
it nothing.

Sigmas: the family's draw (logit-normal unless train.timestep_sampling says otherwise)
shifted as the pipeline shifts its schedule for this many video tokens: exp(mu), mu
linear in the token count from base_shift at base_image_seq_len to max_shift at
max_image_seq_len (LTX2Pipeline's calculate_shift with the scheduler's config; the
exponential time shift s' = e^mu s / (1 + (e^mu - 1) s)); train.flow_shift replaces it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from core.models.base import NoiseSample
from core.models.objectives import standard_noise

AUDIO_KEY = "audio_latents"
EVAL_AUDIO_SEED = 20260  # a fixed audio noise where the caller fixed the video noise


@dataclass
class AudioVideoSample(NoiseSample):
    """A NoiseSample with what the audio half needs between predict and loss: the
    generator the video noise came from (None: torch's own), whether the caller fixed the
    video noise (an evaluation: the audio noise is then fixed too), and, once predict
    ran, the audio prediction, its target and which items have audio."""

    generator: Any = None
    fixed_noise: bool = False
    # Image-to-video (i2v.py): the first latent frame is the clean condition, at
    # timestep 0, and takes no loss.
    first_frame_given: bool = False
    audio_prediction: Any = None
    audio_target: Any = None
    has_audio: Any = None


def token_shift(scheduler_config: Any, tokens: int) -> float:
    """exp(mu) for `tokens` video tokens (see the module docstring)."""
    base, top = float(scheduler_config.get("base_shift", 0.95)), float(
        scheduler_config.get("max_shift", 2.05))
    lo, hi = int(scheduler_config.get("base_image_seq_len", 1024)), int(
        scheduler_config.get("max_image_seq_len", 4096))
    mu = base + (top - base) * (tokens - lo) / (hi - lo)
    return math.exp(mu)


def audio_inputs(sample: AudioVideoSample, batch: dict[str, Any], length: int,
                 channels: int, steps: int) -> tuple[Any, Any]:
    """The noisy audio tokens [B, L, D] and their timesteps [B] for `sample`, from the
    batch's per-item audio latents ([L, D] or None; `steps`: the scheduler's
    num_train_timesteps); stores the target and the items with audio on `sample`.
    `length`/`channels` size the tokens of a batch without audio."""
    import torch

    device = sample.noisy.device
    b = sample.noisy.shape[0]
    items = batch.get(AUDIO_KEY) or [None] * b
    present = [a for a in items if a is not None]
    if present:
        length, channels = present[0].shape
    clean = torch.stack([torch.zeros(length, channels) if a is None else a.float().cpu()
                         for a in items]).to(device)
    generator = torch.Generator().manual_seed(EVAL_AUDIO_SEED) if sample.fixed_noise \
        else sample.generator
    noise = standard_noise(clean.shape, generator, device)
    has = torch.tensor([a is not None for a in items], device=device)
    sigmas = sample.timesteps.flatten().float().to(device) / steps
    sigmas = torch.where(has, sigmas, torch.ones_like(sigmas))
    s = sigmas.view(-1, 1, 1)
    sample.audio_target = noise - clean
    sample.has_audio = has
    return (1 - s) * clean + s * noise, sigmas * steps


def video_per_item(prediction: Any, sample: NoiseSample) -> Any:
    """Each item's video MSE (over the loss mask's area when datasets.N.masks gives one);
    image-to-video: over the latent frames after the given first one (a one-frame item,
    a still, then has none: 0, kept in the graph)."""
    from core.models.objectives import masked_mean

    error = (prediction.float() - sample.target.float()) ** 2
    if getattr(sample, "first_frame_given", False):
        if error.shape[2] == 1:
            return error.reshape(error.shape[0], -1).sum(dim=1) * 0.0
        error = error[:, :, 1:]
    if sample.mask is not None:
        return masked_mean(error, sample.mask)
    return error.reshape(error.shape[0], -1).mean(dim=1)


def joint_loss(video_per_item: Any, sample: AudioVideoSample) -> Any:
    """Batch mean of each item's video MSE plus, where it has audio, its audio MSE, both
    weighted by the sample's flow loss weights."""
    import torch

    total = video_per_item
    if sample.audio_prediction is not None and bool(sample.has_audio.any()):
        error = (sample.audio_prediction.float() - sample.audio_target.float()) ** 2
        audio = error.reshape(error.shape[0], -1).mean(dim=1)
        total = total + torch.where(sample.has_audio, audio, torch.zeros_like(audio))
    if sample.weights is not None:
        total = total * sample.weights.to(total.device, total.dtype)
    return total.mean()
